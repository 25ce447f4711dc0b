import polite_env  # noqa: F401  (registers myorg/Polite-v0)

import corrgrpo_envs

env = corrgrpo_envs.make("myorg/Polite-v0")
obs, info = env.reset(seed=0)
print(obs["messages"][0]["content"])                      # Say hello to ...
obs, reward, terminated, truncated, info = env.step("Hello there, nice to meet you!")
print(env.unwrapped.reward_names, reward)                 # ('polite', 'brief') [1. 1.]

corrgrpo_envs.check_env("myorg/Polite-v0")               # raises EnvCheckError listing each failure
print("check_env: passed")
