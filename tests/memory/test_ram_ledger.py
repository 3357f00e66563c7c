import textwrap

import pytest

from edge_infer.memory.device import MemoryPool, load_profile
from edge_infer.memory.ledger import LedgerRefusal, Reservation, SharedRamLedger
from edge_infer.runtime.config import load_deploy_config
from edge_infer.runtime.deploy_plan import plan_deploy
from runtime import toys

GiB = 1 << 30

# Three stages on three devices of the laptop, which all draw on one RAM pool (24 GiB usable).
LAPTOP_DEPLOY = """
connectors:
  shared_memory: {max_unacked_per_producer: 4}
stages:
  - stage_id: 0
    name: thinker
    kind: ar
    executor: toy_ar
    device: cpu
    reservation: {weights_bytes: 9 GiB, kv_bytes: KV, buffers_bytes: 512 MiB, runtime_bytes: 256 MiB, max_payload_bytes: 8}
  - stage_id: 1
    name: talker
    kind: external
    executor: onnx_vocoder
    device: igpu
    model: talker.onnx
    reservation: {weights_bytes: 4 GiB, kv_bytes: 0, buffers_bytes: 1 GiB, runtime_bytes: 256 MiB, max_payload_bytes: 1 MiB}
  - stage_id: 2
    name: code2wav
    kind: external
    executor: onnx_vocoder
    device: npu
    model: code2wav.onnx
    reservation: {weights_bytes: 2 GiB, kv_bytes: 0, buffers_bytes: 512 MiB, runtime_bytes: 256 MiB, max_payload_bytes: 1 MiB}
routes:
  - {from: 0, to: 1, contract: token_ids/1}
  - {from: 0, to: 2, contract: token_ids/1}
final_outputs: [1, 2]
"""


def laptop_config(tmp_path, kv):
    path = tmp_path / "laptop-deploy.yaml"
    path.write_text(textwrap.dedent(LAPTOP_DEPLOY).replace("KV", kv))
    return load_deploy_config(path)


def test_stages_on_different_devices_cannot_together_exceed_their_shared_pool(tmp_path):
    plan = plan_deploy(laptop_config(tmp_path, "7 GiB"), load_profile("laptop"))
    assert not plan.admitted
    (pool,) = plan.pools
    assert pool.name == "ram" and pool.devices == ("cpu", "igpu", "npu") and not pool.fits
    assert pool.stage_ids == (0, 1, 2)
    expected = (9 + 7 + 0.5 + 0.25 + 4 + 1 + 0.25 + 2 + 0.5 + 0.25) * GiB + 4 * (8 + 2 * (1 << 20))
    assert pool.reserved_bytes == expected and pool.capacity_bytes == 24 * GiB
    (reason,) = plan.reasons
    assert "stages 0, 1, 2 together overrun pool ram" in reason and "shared by cpu, igpu, npu" in reason
    assert "stage 0 (thinker) on cpu" in reason and "stage 1 (talker) on igpu" in reason
    assert "over by" in reason and "kv_cache_memory_bytes" in reason
    assert plan.stage(1).reservation.transport_bytes == 4 * (1 << 20)  # max unacked x largest payload
    table = plan.render()
    assert "DOES NOT FIT" in table and "REFUSED" in table
    assert plan.to_dict()["admitted"] is False and plan.to_dict()["stages"][0]["kv_bytes"] == 7 * GiB

    smaller = plan_deploy(laptop_config(tmp_path, "3 GiB"), load_profile("laptop"))
    assert smaller.admitted and smaller.pools[0].fits and "ADMITTED" in smaller.render()


def test_a_served_pipeline_books_the_servers_request_bodies_in_flight(tmp_path):
    """Served over HTTP (speech alone), the bodies of the requests in flight are the plan's too, at what a server
    process was measured to hold per body byte; a budget the pool cannot hold is refused, naming the flag."""
    from edge_infer.memory.sizing import request_bodies_bytes

    config = laptop_config(tmp_path, "3 GiB")
    alone = plan_deploy(config, load_profile("laptop"))
    served = plan_deploy(config, load_profile("laptop"), body_bytes_in_flight=32 << 20)
    bodies = request_bodies_bytes(32 << 20)
    assert 2 * (32 << 20) < bodies < 3 * (32 << 20)  # raw and parsed
    assert served.admitted and served.pools[0].reserved_bytes == alone.pools[0].reserved_bytes + bodies
    assert "server: request bodies" in served.render() and served.to_dict()["server"]["buffers_bytes"] == bodies
    assert alone.server is None and "request bodies" not in alone.render()

    too_many = plan_deploy(config, load_profile("laptop"), body_bytes_in_flight=2 * GiB)
    (reason,) = too_many.reasons
    assert "stages 0, 1, 2 and the server's request bodies (--max-body-bytes-in-flight) together overrun pool ram" in reason


def test_plan_refuses_a_device_this_machine_lacks(tmp_path):
    config = laptop_config(tmp_path, "1 GiB")
    plan = plan_deploy(config)  # the detected machine
    from edge_infer.memory.device import detect_machine

    if detect_machine().device("igpu").present:
        pytest.skip("this machine has an iGPU")
    assert any("stage 1 (talker" in r and "placed on igpu, which this machine lacks" in r for r in plan.reasons)


def test_auto_reservation_comes_from_the_executor_plan():
    plan = plan_deploy(load_deploy_config(toys.TOY_SPEECH), load_profile("laptop"))
    ar = plan.stage(0)
    assert ar.reservation.kv_bytes == 4 * 512 * 8  # max_num_seqs x max_model_len x 8 bytes of history
    assert "kv_bytes" in ar.from_executor
    assert plan.admitted


def test_ledger_reserve_refuses_and_release_frees():
    ledger = SharedRamLedger([MemoryPool("ram", 10 * GiB, 8 * GiB, headroom_bytes=1 * GiB)])
    ledger.reserve(Reservation("stage 0", "ram", "cpu", weights_bytes=4 * GiB))
    with pytest.raises(LedgerRefusal, match="stage 1 needs 4.00 GiB in pool ram, which has 3.00 GiB left"):
        ledger.reserve(Reservation("stage 1", "ram", "npu", weights_bytes=3 * GiB, kv_bytes=1 * GiB))
    ledger.release("stage 0")
    ledger.reserve(Reservation("stage 1", "ram", "npu", weights_bytes=3 * GiB, kv_bytes=1 * GiB))
    assert ledger.usage("ram").free_bytes == 3 * GiB
    with pytest.raises(ValueError, match="negative"):
        Reservation("stage 2", "ram", "cpu", kv_bytes=-1)
    with pytest.raises(KeyError, match="known pools: ram"):
        ledger.reserve(Reservation("stage 3", "vram", "igpu"))


def test_plan_command_prints_the_table_and_exits_by_admission(tmp_path, capsys):
    import argparse

    from edge_infer.cli.plan_deploy import run_deploy_plan

    laptop_config(tmp_path, "7 GiB")
    path = str(tmp_path / "laptop-deploy.yaml")
    args = argparse.Namespace(deploy_config=path, profile="laptop", available_bytes=None, json=False)
    assert run_deploy_plan(args) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    args.available_bytes, args.json = 64 * GiB, True
    assert run_deploy_plan(args) == 0
    assert '"admitted": true' in capsys.readouterr().out
    args.json, args.server, args.max_body_bytes_in_flight = False, True, 32 << 20  # plan --server: as serve books it
    assert run_deploy_plan(args) == 0
    assert "server: request bodies" in capsys.readouterr().out
    from edge_infer.cli import main
    from edge_infer.memory.ledger import format_bytes
    from edge_infer.memory.sizing import request_bodies_bytes

    # From the command line, --server alone books serve's default: twice --max-body-bytes (it booked nothing).
    assert main(["plan", "--deploy-config", path, "--profile", "laptop", "--available-bytes", str(64 * GiB),
                 "--server"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("server: request bodies")]
    assert format_bytes(request_bodies_bytes(2 * (16 << 20))) in row
    args.deploy_config = str(tmp_path / "missing.yaml")
    assert run_deploy_plan(args) == 2
    assert "not found" in capsys.readouterr().err
