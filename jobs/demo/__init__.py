"""The demo job (`replaylake demo`, `make run`): a tiny policy trained with async GRPO through
replaylake. `main` is the command; config, flags, policy, rollout, trainer, summary and shell
its parts."""
