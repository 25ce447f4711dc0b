corrgrpo envs check polite_env:PoliteEnv                     # one line per check; exit 1 on a failure
corrgrpo eval polite.yaml --split all --policy reference     # the harness: references score 1.0
corrgrpo train polite.yaml                                   # -> runs/polite-corrgrpo-s0
corrgrpo eval polite.yaml --split all --checkpoint runs/polite-corrgrpo-s0/checkpoint-20
