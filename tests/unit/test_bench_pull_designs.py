"""bench/pull_designs.py's command line (its runs take minutes and are not tests)."""

from __future__ import annotations

import pytest

from bench import pull_designs


@pytest.mark.parametrize("argv, flag", [(["--messages", "3"], "--messages"), (["--runs", "0"], "--runs")])
def test_bad_sizes_are_refused_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        pull_designs.main(argv)
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err
