corrgrpo train quickstart.yaml                                       # -> runs/quickstart-corrgrpo-s0
corrgrpo train quickstart.yaml algorithm.estimator=grpo train.seed=1 # -> runs/quickstart-grpo-s1
corrgrpo plot runs/quickstart-corrgrpo-s0 runs/quickstart-grpo-s1 --labels corrgrpo grpo
corrgrpo advise runs/quickstart-corrgrpo-s0 runs/quickstart-grpo-s1
