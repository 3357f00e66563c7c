"""Qwen3-TTS (12 Hz, CustomVoice): Talker, code predictor and Code2Wav in plain torch.

Submodules import torch; this package module does not, so listing or
reading presets stays cheap. See docs/qwen3-tts.md for the architecture.
"""
