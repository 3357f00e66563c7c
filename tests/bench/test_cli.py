from __future__ import annotations

import pytest

from edge_infer.bench.cli import SUBCOMMANDS
from edge_infer.cli import main


def test_bench_without_subcommand_lists_them(capsys):
    assert main(["bench"]) == 2
    out = capsys.readouterr().out
    assert all(name in out for name in SUBCOMMANDS)


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", name, "--help"])
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out
