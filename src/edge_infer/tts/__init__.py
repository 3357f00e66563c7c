"""Text-to-speech: the Qwen3-TTS Talker on the engine's machinery, the two pipeline stages, the CLI.

Submodules import torch; this package module does not.
"""
