"""The learned diagnosis's training side (docs/design.md "Learned diagnosis"): the episode generators
and their fresh hold-outs, training, fine-tuning and evaluation. The runtime (`stethoscope`) never
imports it; `stethoscope model train|evaluate|finetune` do, lazily. Training needs torch (the
`train` extra); generation and evaluation numpy and onnxruntime alone."""
