"""What a finding can do (DESIGN.md "Rules", actions): log, alert, api_call, playbook."""
