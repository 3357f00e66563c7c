import textwrap
from pathlib import Path

import psutil
import pytest

from edge_infer.runtime.config import (
    OVERRIDES,
    DeployConfigError,
    bundled_configs,
    load_deploy_config,
)

BASE = """
pipeline: {name: base}
stages:
  - stage_id: 0
    kind: ar
    executor: toy_ar
    engine: {max_num_seqs: 2, max_model_len: 128}
    default_sampling: {max_tokens: 5, seed: 1}
  - stage_id: 1
    kind: generation
    executor: toy_vocoder
    executor_options: {chunk_tokens: 2, samples_per_token: 16}
routes:
  - {from: 0, to: 1, contract: token_ids/1}
final_outputs: [1]
"""


def write(dir: Path, name: str, text: str) -> Path:
    path = dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def only_problem(exc_info):
    problems = exc_info.value.problems
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


def test_overlay_merges_stages_by_id_and_replaces_lists(tmp_path):
    write(tmp_path, "base.yaml", BASE)
    top = write(tmp_path, "top.yaml", """
        base_config: base.yaml
        stages:
          - stage_id: 0
            engine: {max_num_seqs: 4}
          - stage_id: 2
            kind: generation
            executor: toy_vocoder
        routes:
          - {from: 0, to: 1, contract: token_ids/1}
          - {from: 0, to: 2, contract: token_ids/1}
        final_outputs: [1, 2]
    """)
    config = load_deploy_config(top)
    ar = config.stage(0)
    assert ar.engine.max_num_seqs == 4  # the file beats its base
    assert ar.engine.max_model_len == 128  # the base's sibling key survives the merge
    assert ar.default_sampling.max_tokens == 5
    assert config.stage(1).executor_options == {"chunk_tokens": 2, "samples_per_token": 16}
    assert [(r.from_stage, r.to_stage) for r in config.routes] == [(0, 1), (0, 2)]  # lists are replaced
    assert config.pipeline.name == "base"


def test_precedence_overrides_then_file_then_base_chain_then_defaults(tmp_path):
    write(tmp_path, "base.yaml", BASE)
    write(tmp_path, "mid/mid.yaml", """
        base_config: ../base.yaml
        connectors: {shared_memory: {max_unacked_per_producer: 3}}
        stages: [{stage_id: 0, engine: {max_num_seqs: 3}, default_sampling: {max_tokens: 7}}]
    """)
    top = write(tmp_path, "top.yaml", """
        base_config: mid/mid.yaml
        stages: [{stage_id: 0, engine: {max_num_seqs: 5}}]
    """)
    config = load_deploy_config(top, stage_overrides='{"0": {"engine": {"max_num_seqs": 9}}}')
    ar = config.stage(0)
    assert ar.engine.max_num_seqs == 9  # override > file (5) > mid (3) > base (2)
    assert ar.default_sampling.max_tokens == 7  # mid > base (5)
    assert ar.default_sampling.seed == 1  # only the base sets it
    assert config.connectors.shared_memory.max_unacked_per_producer == 3
    assert config.connectors.shared_memory.inline_threshold_bytes == 64 * 1024  # schema default
    assert ar.engine.dtype == "auto"
    without = load_deploy_config(top)
    assert without.stage(0).engine.max_num_seqs == 5


def test_bundled_configs_load_by_name_and_serve_as_base(tmp_path):
    bundled = set(bundled_configs())
    assert {"text", "qwen3_tts"} <= bundled
    assert not any(name.startswith("toy") for name in bundled)  # test doubles are not shipped
    models = {"0": {"model": str(tmp_path)}, "1": {"model": str(tmp_path)}}
    speech = load_deploy_config("qwen3_tts", stage_overrides=models)
    assert speech.stage_ids == [0, 1] and speech.final_outputs == [1]
    top = write(tmp_path, "mine.yaml", "base_config: qwen3_tts\nstages: [{stage_id: 1, executor_options: {max_chunk_frames: 2}}]\n")
    assert load_deploy_config(top, stage_overrides=models).stage(1).executor_options["max_chunk_frames"] == 2


def test_reservation_accepts_auto_and_byte_strings(tmp_path):
    top = write(tmp_path, "r.yaml", BASE.replace("engine: {max_num_seqs: 2, max_model_len: 128}", "reservation: {weights_bytes: 1.5 GiB, kv_bytes: 4096}"))
    r = load_deploy_config(top).stage(0).reservation
    assert r.weights_bytes == 1536 * 1024 * 1024 and r.kv_bytes == 4096 and r.buffers_bytes is None
    top.write_text(top.read_text().replace("reservation: {weights_bytes: 1.5 GiB, kv_bytes: 4096}", "reservation: auto"))
    assert load_deploy_config(top).stage(0).reservation.weights_bytes is None


def test_relative_model_path_is_relative_to_the_declaring_file(tmp_path):
    write(tmp_path, "models/voc.onnx", "x")
    write(tmp_path, "base.yaml", BASE.replace("executor: toy_ar", "executor: toy_ar\n    model: models/voc.onnx"))
    top = write(tmp_path, "sub/top.yaml", "base_config: ../base.yaml\n")
    assert load_deploy_config(top).stage(0).model == str((tmp_path / "models/voc.onnx").resolve())


# --- errors: each names the file, the key path and the fix --------------------


def test_unknown_top_level_key(tmp_path):
    top = write(tmp_path, "top.yaml", BASE + "stagse: []\n")
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert (p.file, p.key_path) == (str(top), "stagse")
    assert "unknown key" in p.problem and "stages" in p.fix


def test_unknown_key_is_blamed_on_the_base_file_that_set_it(tmp_path):
    base = write(tmp_path, "base.yaml", BASE.replace("max_num_seqs: 2", "max_num_seq: 2"))
    top = write(tmp_path, "top.yaml", "base_config: base.yaml\npipeline: {name: top}\n")
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert (p.file, p.key_path) == (str(base), "stages[id=0].engine.max_num_seq")
    assert "max_num_seqs" in p.fix
    assert str(base) in str(exc.value) and "Fix:" in str(exc.value)


def test_unknown_executor_option(tmp_path):
    top = write(tmp_path, "top.yaml", BASE.replace("chunk_tokens: 2", "chunk_token: 2"))
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert p.key_path == "stages[id=1].executor_options.chunk_token"
    assert "chunk_tokens" in p.fix


def test_negative_reservation(tmp_path):
    top = write(tmp_path, "top.yaml", BASE.replace("executor: toy_ar", "executor: toy_ar\n    reservation: {kv_bytes: -1}"))
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert p.key_path == "stages[id=0].reservation.kv_bytes"
    assert "negative" in p.problem and "byte count" in p.fix


def test_bad_reservation_word(tmp_path):
    top = write(tmp_path, "top.yaml", BASE.replace("executor: toy_ar", "executor: toy_ar\n    reservation: lots"))
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    assert only_problem(exc).key_path == "stages[id=0].reservation"


def test_bad_device_and_missing_executor_reported_together(tmp_path):
    text = BASE.replace("executor: toy_ar\n", "device: gpu\n")
    top = write(tmp_path, "top.yaml", text)
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    found = {p.key_path: p for p in exc.value.problems}
    assert "'cpu', 'igpu' or 'npu'" in found["stages[id=0].device"].fix
    assert "executor" in found["stages[id=0].executor"].fix


def test_duplicated_stage_id_in_one_file(tmp_path):
    top = write(tmp_path, "top.yaml", BASE.replace("stage_id: 1", "stage_id: 0"))
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert (p.file, p.key_path) == (str(top), "stages[1].stage_id")
    assert "twice" in p.problem


@pytest.mark.parametrize(
    ("routes", "finals", "key_path", "words"),
    [
        ("[{from: 0, to: 5, contract: token_ids/1}]", "[1]", "routes[0].to", "stage 5"),
        ("[{from: 0, to: 1, contract: token_ids/1}, {from: 1, to: 0, contract: token_ids/1}]", "[1]", "routes", "cycle: 0 -> 1 -> 0"),
        ("[{from: 0, to: 0, contract: token_ids/1}, {from: 0, to: 1, contract: token_ids/1}]", "[1]", "routes[0]", "own stage"),
        ("[{from: 0, to: 1, contract: token_ids/1}, {from: 0, to: 1, contract: token_ids/1}]", "[1]", "routes[1]", "twice"),
        ("[{from: 0, to: 1, contract: token_ids/1}]", "[1, 7]", "final_outputs[1]", "does not exist"),
        ("[{from: 0, to: 1, contract: token_ids/1}]", "[0]", "final_outputs", "discarded"),
        ("[{from: 0, to: 1, contract: token_id/1}]", "[1]", "routes[0].contract", "unknown contract"),
        ("[]", "[0, 1]", "stages[id=0]", "on no route"),
    ],
)
def test_graph_errors(tmp_path, routes, finals, key_path, words):
    text = BASE.split("routes:")[0] + f"routes: {routes}\nfinal_outputs: {finals}\n"
    top = write(tmp_path, "top.yaml", text)
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    match = [p for p in exc.value.problems if p.key_path == key_path]
    assert match, [str(p) for p in exc.value.problems]
    assert words in match[0].problem and match[0].file == str(top) and match[0].fix


def test_contract_mismatch_is_refused_at_load_before_any_process(tmp_path):
    # toy_ar emits token_ids/1; pcm_audio/1 is neither what it emits nor what the vocoder accepts.
    top = write(tmp_path, "top.yaml", BASE.replace("contract: token_ids/1", "contract: pcm_audio/1"))
    children = {c.pid for c in psutil.Process().children(recursive=True)}
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    text = [p.problem for p in exc.value.problems]
    assert any("stage 0 (executor toy_ar) emits token_ids/1" in t for t in text)
    assert any("stage 1 (executor toy_vocoder) accepts codec_codes/1, token_ids/1" in t for t in text)
    assert {c.pid for c in psutil.Process().children(recursive=True)} <= children  # none started


def test_unknown_executor_kind_and_device(tmp_path):
    text = BASE.replace("executor: toy_vocoder", "executor: toy_vocodr").replace("kind: ar", "kind: generation")
    top = write(tmp_path, "top.yaml", text.replace("executor: toy_ar", "executor: toy_ar\n    device: npu"))
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    found = {p.key_path: p for p in exc.value.problems}
    assert "toy_vocoder" in found["stages[id=1].executor"].fix
    assert "serves kind ar" in found["stages[id=0].kind"].problem
    assert "runs on cpu, not npu" in found["stages[id=0].device"].problem


def test_base_config_errors(tmp_path):
    top = write(tmp_path, "top.yaml", "base_config: nowhere.yaml\n")
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert (p.file, p.key_path) == (str(top), "base_config") and "nowhere.yaml" in p.problem
    write(tmp_path, "a.yaml", "base_config: b.yaml\n")
    write(tmp_path, "b.yaml", "base_config: a.yaml\n")
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(tmp_path / "a.yaml")
    assert "loops" in only_problem(exc).problem


def test_yaml_syntax_error_names_file(tmp_path):
    top = write(tmp_path, "top.yaml", "stages: [\n")
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert p.file == str(top) and "YAML" in p.problem


def test_stage_override_errors(tmp_path):
    top = write(tmp_path, "top.yaml", BASE)
    cases = [
        ("{not json", "", "not valid JSON"),
        ('{"9": {"engine": {}}}', '["9"]', "no stage 9"),
        ('{"x": {}}', "['x']", "not a stage id"),
        ('{"0": 3}', "['0']", "must be an object"),
    ]
    for raw, key_path, words in cases:
        with pytest.raises(DeployConfigError) as exc:
            load_deploy_config(top, stage_overrides=raw)
        p = only_problem(exc)
        assert (p.file, p.key_path) == (OVERRIDES, key_path) and words in p.problem, str(p)


def test_bad_value_from_override_is_blamed_on_the_override(tmp_path):
    top = write(tmp_path, "top.yaml", BASE)
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top, stage_overrides={"0": {"engine": {"max_num_seqs": 0}}})
    p = only_problem(exc)
    assert (p.file, p.key_path) == (OVERRIDES, "stages[id=0].engine.max_num_seqs")
    assert ">= 1" in p.fix


@pytest.mark.parametrize(
    ("text", "key_path", "words"),
    [
        ("- just a list\n", "", "not a mapping"),
        ("stages: {stage_id: 0}\nfinal_outputs: [0]\n", "stages", "must be a list"),
        ("stages: [3]\nfinal_outputs: [0]\n", "stages[0]", "must be a mapping"),
        ("stages: [{stage_id: one, kind: ar, executor: toy_ar}]\nfinal_outputs: [0]\n", "stages[0].stage_id", "integer >= 0"),
        ("base_config: [a.yaml]\n", "base_config", "must be a file path"),
        ("stages: [{stage_id: 0, kind: ar, executor: toy_ar}]\nfinal_outputs: []\n", "final_outputs", "at least 1"),
        ("stages: [{stage_id: 0, kind: ar, executor: toy_ar}]\nfinal_outputs: [0, 0]\n", "final_outputs", "listed twice"),
        ("stages: [{stage_id: 0, kind: external, executor: onnx_vocoder}]\nfinal_outputs: [0]\n", "stages[id=0].model", "needs a model"),
        ("stages: [{stage_id: 0, kind: ar, executor: toy_ar, engine: {dtype: int8}}]\nfinal_outputs: [0]\n", "stages[id=0].engine.dtype", "'bfloat16'"),
        ("stages: [{stage_id: 0, kind: ar, executor: toy_ar, nice: -5}]\nfinal_outputs: [0]\n", "stages[id=0].nice", ">= 0"),
        ("stages: [{stage_id: 0, kind: ar, executor: toy_ar, nice: 20}]\nfinal_outputs: [0]\n", "stages[id=0].nice", "<= 19"),
    ],
)
def test_more_config_errors_name_file_key_and_fix(tmp_path, text, key_path, words):
    top = write(tmp_path, "top.yaml", text)
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top)
    p = only_problem(exc)
    assert (p.file, p.key_path) == (str(top), key_path)
    assert words in p.problem + p.fix and p.fix


def test_override_cannot_change_a_stage_id(tmp_path):
    top = write(tmp_path, "top.yaml", BASE)
    with pytest.raises(DeployConfigError) as exc:
        load_deploy_config(top, stage_overrides='{"0": {"stage_id": 3}}')
    p = only_problem(exc)
    assert (p.file, p.key_path) == (OVERRIDES, '["0"].stage_id')


def test_missing_config_file_lists_bundled_configs(tmp_path):
    with pytest.raises(FileNotFoundError, match="bundled configs: .*qwen3_tts"):
        load_deploy_config(tmp_path / "nope.yaml")
