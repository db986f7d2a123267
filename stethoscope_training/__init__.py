"""The learned diagnosis's training side (docs/design.md "Learned diagnosis"): the episode generators
and their fresh hold-outs, training, fine-tuning and evaluation. The runtime (`stethoscope`) never
imports it; `stethoscope model train|evaluate|finetune` do, lazily. A distribution of its own,
aicluster-stethoscope-training (training/pyproject.toml), which brings torch; generation and evaluation
need numpy and onnxruntime alone."""

__version__ = "1.0.0"  # the runtime's (stethoscope.__version__): the two are released together
