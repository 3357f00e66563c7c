import glob
import os

import pytest

from edge_infer.memory.device import bundled_profiles, detect_machine, load_profile


def meminfo_kib(key):
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads Linux /proc")
def test_detected_machine_reads_ram_cpus_and_says_which_devices_are_absent():
    machine = detect_machine()
    ram = machine.pool("ram")
    assert 0 < ram.available_bytes <= ram.total_bytes <= meminfo_kib("MemTotal") * 1024
    cpu = machine.device("cpu")
    assert cpu.present and cpu.pool == "ram" and cpu.compute.cores == len(os.sched_getaffinity(0))
    for name, nodes in (("igpu", "/dev/dri/renderD*"), ("npu", "/dev/accel/accel*")):
        device = machine.device(name)
        assert device.present == bool(glob.glob(nodes))
        if not device.present:
            assert device.note.startswith("absent:")


def test_laptop_profile_shares_one_ram_pool_between_cpu_igpu_and_npu():
    assert "laptop" in bundled_profiles()
    laptop = load_profile("laptop")
    assert [p.name for p in laptop.pools] == ["ram"]
    assert laptop.devices_on("ram") == ["cpu", "igpu", "npu"]
    ram = laptop.pool("ram")
    assert ram.total_bytes == 32 << 30 and ram.capacity_bytes == (28 - 4) << 30


def test_profile_file_corrects_the_detected_machine(tmp_path):
    path = tmp_path / "box.yaml"
    path.write_text(
        "name: box\ndetect: true\n"
        "pools: [{name: ram, headroom_bytes: 1 GiB}]\n"
        "devices: [{name: npu, present: true, peak_tops: 40, note: vendor driver not exposed in /dev}]\n"
    )
    box, detected = load_profile(path), detect_machine()
    assert box.pool("ram").total_bytes == detected.pool("ram").total_bytes
    assert box.pool("ram").headroom_bytes == 1 << 30
    assert box.device("npu").present and box.device("npu").compute.peak_tops == 40
    assert box.device("cpu") == detected.device("cpu")


def test_profile_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\npools: [{name: ram, total_bytes: 1 GiB}]\ndevices: [{name: igpu, pool: vram}]\n")
    with pytest.raises(ValueError, match="bad.yaml: device igpu draws on pool 'vram'"):
        load_profile(path)
    path.write_text("name: bad\nflavour: x\n")
    with pytest.raises(ValueError, match="bad.yaml: invalid machine profile"):
        load_profile(path)
    with pytest.raises(FileNotFoundError, match="bundled profiles: laptop"):
        load_profile("no-such-profile")
