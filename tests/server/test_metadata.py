"""``Memory.metadata``: a client's JSON object kept with a memory, encrypted like its text.

It is returned on every read, and changed only when an update names it.
"""

from __future__ import annotations

import grpc
import pytest
from _helpers import files_containing, unique
from conftest import Lethe
from google.protobuf import json_format

import lethe.client as lc


def test_metadata_round_trips_through_create_get_list_and_search(lethe: Lethe) -> None:
    c = lethe.client("alice")
    value = {"namespace": ["prefs", "ui"], "n": 3, "on": True, "none": None, "xs": [1.5, "a"]}
    made = c.create_memory(
        "owners/alice",
        {"kind": "FACT", "text": "likes dark mode", "state": "COMMITTED", "metadata": value},
        memory_id="m1",
    )
    as_dict = {"namespace": ["prefs", "ui"], "n": 3.0, "on": True, "none": None, "xs": [1.5, "a"]}
    assert json_format.MessageToDict(made.metadata) == as_dict
    got = c.get_memory(made.name)
    assert json_format.MessageToDict(got.metadata) == as_dict
    listed = list(c.iter_memories("owners/alice"))
    assert json_format.MessageToDict(listed[0].metadata) == as_dict
    hit = c.search("owners/alice", query_text="dark mode", kinds=["FACT"]).hits[0]
    assert json_format.MessageToDict(hit.memory.metadata) == as_dict
    plain = c.create_memory("owners/alice", {"kind": "FACT", "text": "no metadata"})
    assert not c.get_memory(plain.name).HasField("metadata")


def test_update_changes_metadata_only_when_named_or_given(lethe: Lethe) -> None:
    c = lethe.client("alice")
    m = c.create_memory(
        "owners/alice", {"kind": "ANNOTATION", "text": "a", "metadata": {"v": 1}}, memory_id="m"
    )
    kept = c.update_memory({"name": m.name, "text": "b"}, update_mask=["text"])
    assert (kept.text, json_format.MessageToDict(kept.metadata)) == ("b", {"v": 1.0})
    kept = c.update_memory({"name": m.name, "text": "c"})  # empty mask, metadata not set
    assert json_format.MessageToDict(kept.metadata) == {"v": 1.0}
    changed = c.update_memory({"name": m.name, "text": "d", "metadata": {"v": 2}})
    assert json_format.MessageToDict(changed.metadata) == {"v": 2.0}
    only = c.update_memory({"name": m.name, "metadata": {"w": "x"}}, update_mask=["metadata"])
    assert (only.text, json_format.MessageToDict(only.metadata)) == ("d", {"w": "x"})
    old = c.get_memory(m.name, version=1)
    assert json_format.MessageToDict(old.metadata) == {"v": 1.0}


def test_metadata_over_its_limit_is_a_bad_field(lethe: Lethe) -> None:
    c = lethe.client("alice")
    with pytest.raises(lc.BadField) as err:
        c.create_memory(
            "owners/alice", {"kind": "FACT", "text": "big", "metadata": {"x": "y" * 300_000}}
        )
    assert err.value.fields == ["memory.metadata"]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_metadata_is_never_stored_in_plaintext(lethe: Lethe) -> None:
    c = lethe.client("alice")
    secret_key, secret_value = unique("mkey"), unique("mval")
    c.create_memory(
        "owners/alice",
        {
            "kind": "FACT",
            "text": "t",
            "state": "COMMITTED",
            "metadata": {secret_key: secret_value, "ns": [unique("mns")]},
        },
    )
    lethe.stop()
    assert files_containing(lethe.data_dir, [secret_key, secret_value]) == []
