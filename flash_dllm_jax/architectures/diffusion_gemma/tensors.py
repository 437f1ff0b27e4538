"""DiffusionGemma's Hugging Face tensor names: none mapped yet (the
family loads Google's orbax checkpoint: checkpoint.py)."""

TABLE = ()
