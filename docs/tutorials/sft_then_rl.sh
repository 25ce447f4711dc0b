corrgrpo sft sft_smollm2.yaml                                             # -> runs/sft/model
corrgrpo eval rl_smollm2.yaml --checkpoint runs/sft --split eval --limit 50
corrgrpo train rl_smollm2.yaml                                            # -> runs/rl
corrgrpo eval rl_smollm2.yaml --checkpoint runs/rl/checkpoint-30 --split eval --limit 50
