corrgrpo envs list                    # every env: its rewards, their ranges and weights, its tasks
corrgrpo advantages --demo            # GRPO against CorrGRPO on the paper's worked example
corrgrpo train --help | head -20      # the first of every setting: type, allowed values, default
