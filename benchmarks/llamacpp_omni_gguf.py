"""Write a Qwen2.5-Omni thinker checkpoint as llama.cpp's two GGUFs, with llama.cpp's own converter.

    python benchmarks/llamacpp_omni_gguf.py LLAMA_CPP_SRC MODEL OUT_DIR

LLAMA_CPP_SRC is the llama.cpp tree vendored in the llama-cpp-python sdist (its convert_hf_to_gguf.py, the
conversion package and gguf-py); MODEL an `edge-infer synth --family qwen2_5_omni` checkpoint. Writes
OUT_DIR/<name>-bf16.gguf (the text model, llama.cpp's qwen2vl) and OUT_DIR/<name>-mmproj-f16.gguf (the towers,
projector qwen2.5o) for `edge-infer bench llamacpp media`.

The converter takes the full Qwen2.5-Omni layout (thinker_config inside the top config); the synthetic checkpoint
is the thinker alone, so it is presented through a directory of links with that config around it. Its BPE
vocabulary is Qwen2's pre-tokenizer over a synthetic merge list, which the converter cannot fingerprint: it is
declared "qwen2", as edge-infer's own GGUF export declares for the family.
"""
from __future__ import annotations

import json
import runpy
import sys
import tempfile
from pathlib import Path


def omni_layout(model: Path, into: Path) -> Path:
    """A directory the converter reads as Qwen2_5OmniModel: links to the thinker's files, its config wrapped."""
    for f in model.iterdir():
        if f.name != "config.json":
            (into / f.name).symlink_to(f.resolve())
    thinker = json.loads((model / "config.json").read_text())
    wrapped = {"architectures": ["Qwen2_5OmniModel"], "model_type": "qwen2_5_omni", "thinker_config": thinker,
               "enable_audio_output": False}
    (into / "config.json").write_text(json.dumps(wrapped))
    return into


def main() -> int:
    src, model, out = (Path(a) for a in sys.argv[1:4])
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    from conversion.base import TextModel
    from conversion.qwenvl import Qwen2VLModel

    TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    Qwen2VLModel.set_vocab = lambda self: self._set_vocab_gpt2()
    out.mkdir(parents=True, exist_ok=True)
    name = model.resolve().name
    with tempfile.TemporaryDirectory() as tmp:
        layout = omni_layout(model, Path(tmp))
        for extra, outfile in (([], f"{name}-bf16.gguf"), (["--mmproj"], f"{name}-mmproj-f16.gguf")):
            outtype = "f16" if extra else "bf16"
            sys.argv = [str(src / "convert_hf_to_gguf.py"), str(layout), *extra, "--outtype", outtype,
                        "--outfile", str(out / outfile)]
            runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
