"""World-model fine-tuning: examples from trajectories (data), the steps a world model is judged
on (cases), LoRA training with TRL's SFT trainer (train), published adapter versions (adapters),
exact-hit evaluation (evaluate), and `run_train_worldmodel`, what `obsspec train-worldmodel`
calls (run)."""
