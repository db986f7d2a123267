"""`python -m stethoscope.cli`: what the playbooks run with the controller's own interpreter."""

import sys

from stethoscope.cli.main import main

sys.exit(main())
