"""Qwen3-TTS (12 Hz, CustomVoice): the Talker (decoder and code predictor on the text engine's ``DecoderLM``) and Code2Wav.

Submodules import torch; this package module does not, so listing or
reading presets stays cheap. See docs/qwen3-tts.md for the architecture.
"""
