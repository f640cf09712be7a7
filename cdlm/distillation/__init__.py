"""Step distillation: few-step students of gaussian (progressive, consistency) and masked
(SDTT) teachers; see docs/distillation.md."""
