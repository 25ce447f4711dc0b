for estimator in grpo corrgrpo gdpo; do
  for seed in 0 1 2; do
    corrgrpo train quickstart.yaml algorithm.estimator=$estimator train.seed=$seed
  done
done
corrgrpo advise runs/quickstart-grpo-s0 runs/quickstart-corrgrpo-s0 runs/quickstart-gdpo-s0
python compare.py
