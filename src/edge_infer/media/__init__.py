"""Media preprocessing: images, audio and video into encoder features, without torch or transformers.

One job per module: ``config`` (a checkpoint's processor settings), ``sources`` (bytes from data:,
file:// and http(s) URLs under the operator's policy), ``limits`` (per-request limits and their
refusals), ``image`` / ``audio`` / ``video`` (decode and featurize), ``features`` (what crosses the
worker pipe). Pillow, soundfile, soxr and PyAV are imported inside the functions that use them.
"""
