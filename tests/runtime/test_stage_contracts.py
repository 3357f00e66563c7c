import json
from pathlib import Path

import numpy as np
import pytest

from edge_infer.runtime.contracts import (
    Payload,
    from_wire,
    known_contracts,
    to_wire,
    validate,
    validate_wire,
)

FIXTURES = Path(__file__).resolve().parents[2] / "contracts" / "conformance"


def _cases():
    for path in sorted(FIXTURES.glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc["format"] == "edge-infer-contract-conformance/1"
        for case in doc["cases"]:
            yield pytest.param(case, id=f"{path.stem}: {case['name']}")


@pytest.mark.parametrize("case", list(_cases()))
def test_conformance_fixture_gives_expected_verdict(case):
    verdict = validate_wire(case["payload"])
    assert verdict.valid == case["expect"]["valid"], verdict.reasons
    assert verdict.codes == sorted(case["expect"]["violations"]), verdict.reasons


def test_every_contract_has_valid_and_invalid_fixtures():
    seen: dict[str, set[bool]] = {}
    for path in FIXTURES.glob("*.json"):
        for case in json.loads(path.read_text())["cases"]:
            seen.setdefault(case["payload"]["contract"], set()).add(case["expect"]["valid"])
    for contract in known_contracts():
        assert seen.get(contract) == {True, False}, contract


def test_wire_round_trip_keeps_dtype_shape_and_values():
    arr = np.arange(12, dtype=np.int16).reshape(6, 2)
    payload = Payload("codec_codes/1", arr, {"num_codebooks": 2, "frame_rate_hz": 12.5})
    back = from_wire(json.loads(json.dumps(to_wire(payload))))
    assert back.data.dtype == np.int16 and back.data.shape == (6, 2)
    assert np.array_equal(back.data, arr)
    assert back.metadata == payload.metadata


def test_verdict_reasons_name_the_problem():
    verdict = validate(Payload("pcm_audio/1", np.zeros(4, np.float32), {"sample_rate": 24000, "channels": 2}))
    assert not verdict
    assert any("channels must be 1" in r for r in verdict.reasons)
