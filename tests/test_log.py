"""Diagnostics go through logging (trainer/log.py) and read exactly as the printed lines did: the
bare message on the stderr of the moment (a capture made after import sees them)."""

import logging

from splat_train.trainer import log


def test_diagnostics_are_bare_lines_on_current_stderr(capsys):
    logger = log.get_logger("splat_train.trainer.somewhere")
    logger.warning("warning: something to know")
    logger.error("error (rank 1): bad flag")
    logger.debug("not shown")  # INFO and above
    captured = capsys.readouterr()
    assert captured.err == "warning: something to know\nerror (rank 1): bad flag\n"
    assert captured.out == ""


def test_records_carry_the_rank():
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.rank)

    root = logging.getLogger(log.ROOT)
    keep = Keep()
    for h in root.handlers:  # the package's handler stamps the rank
        keep.filters.extend(h.filters)
    root.addHandler(keep)
    try:
        log.set_rank(3)
        log.get_logger(__name__).warning("x")
    finally:
        log.set_rank(0)
        root.removeHandler(keep)
    assert seen == [3]
