"""The start-up check that every rank sees the run directory as one shared filesystem
(:func:`unifiedplayers.distributed.check_shared_directory`): two gloo ranks under torchrun pass it in one directory,
and when rank 1 looks in a directory of its own (a node that does not mount rank 0's), both ranks stop with an error
naming the directory and the node."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from unifiedplayers.distributed import SINGLE, check_shared_directory, shared_directory_error
from tests.distributed.launch import torchrun  # noqa: E402

pytestmark = [pytest.mark.cpu]

WORKER = Path(__file__).with_name("shared_dir_worker.py")


def test_a_rank_that_cannot_see_rank_0s_directory_stops_every_rank(tmp_path):
    shared, elsewhere, out = tmp_path / "run", tmp_path / "node1" / "run", tmp_path / "said"
    elsewhere.mkdir(parents=True)  # rank 1's node has a directory of its own at that path
    torchrun(WORKER, str(shared), str(elsewhere), str(out), env={"UNIFIEDPLAYERS_HANG_LIMIT_S": "30"}, timeout=120)
    said = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]
    assert [s[0] for s in said] == ["ok", "ok"]  # one directory: both pass
    assert said[0][1] == said[1][1]  # the other: both ranks stop, with one message
    host = socket.gethostname()
    assert said[0][1].startswith(f"the run directory {shared} is not one filesystem shared by every node of the job: "
                                 f"node {host} (rank 1, looking in {elsewhere}) could not read the file that rank 0 "
                                 f"wrote there on node {host}"), said[0][1]
    assert list(shared.iterdir()) == [] and list(elsewhere.iterdir()) == []  # rank 0 removed its file


def test_one_process_checks_nothing(tmp_path):
    check_shared_directory(SINGLE, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_message_names_each_node_that_could_not_see_it():
    ranks = [(True, "a", 0, "/r"), (True, "a", 1, "/r"), (False, "b", 2, "/r"), (False, "c", 3, "/r")]
    assert "node b (rank 2), node c (rank 3) could not read the file that rank 0 wrote there on node a" in \
        shared_directory_error(ranks)
    assert shared_directory_error(ranks, "rank 0 could not write there (denied)") == \
        "the run directory /r cannot be checked on node a: rank 0 could not write there (denied)"
