"""The node-episode hold-outs of generator versions 1-12 (fresh sets 1-13), retired: each was written
before (set 1: after) the model it scored was trained, scored it once, and became training data when
the next set was written (stethoscope_training/episodes.py takes their families; fresh.py is the
current hold-out, set 14). `setNN.py` holds set NN's families as `SET<N>` (set01.py: SET1), and its
docstring what the set found."""
