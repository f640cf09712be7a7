"""Step distillation: few-step students of gaussian (progressive, consistency) and masked or
block-diffusion (SDTT) teachers; see docs/results/historical/distillation.md."""
