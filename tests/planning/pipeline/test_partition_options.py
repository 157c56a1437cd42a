"""PartitionOptions and the schedule table (issue 32, step 3): one options object for partition(),
split --run and the torchrun launcher; schedules as one table."""

from __future__ import annotations

import inspect

import pytest
import torch

import layerscope as ls
from layerscope.examples import small_cnn
from layerscope.options import entry_options, parse_bandwidth, parse_bytes
from layerscope.planning.config import LAUNCHER_FIELDS, SCHEDULES, PartitionOptions, schedule_of
from layerscope.planning.steptime.schedule import MULTI, ZERO_BUBBLE, rank_orders, stage_ranks


def _params(fn) -> int:
    return len(inspect.signature(fn).parameters)


def test_entry_points_take_at_most_twelve_parameters():
    from layerscope.torchrun import launch
    assert _params(ls.partition) <= 12 and _params(launch) <= 12


def test_an_option_given_both_ways_is_an_error():
    x = torch.randn(4, 3, 32, 32)
    with pytest.raises(ls.InputError, match="both as a keyword and in options="):
        ls.partition(small_cnn(), x, options=PartitionOptions(stages=2), stages=2)
    with pytest.raises(ls.InputError, match="both as a keyword and in options="):
        ls.partition(small_cnn(), x, options=PartitionOptions(stages=2), cuts=[1])


def test_options_object_and_keywords_give_the_same_plan():
    x = torch.randn(4, 3, 32, 32)
    by_keywords = ls.partition(small_cnn(), x, stages=2, microbatches=2, schedule="gpipe", return_outputs=False)
    by_object = ls.partition(small_cnn(), x, options=PartitionOptions(stages=2, microbatches=2, schedule="gpipe",
                                                                      return_outputs=False))
    assert by_keywords.to_dict() == by_object.to_dict()


def test_partition_leaves_launcher_names_to_the_forward():
    # input_ids is a launcher option and a forward argument of most language models: partition()
    # passes it to the forward
    opts, rest = entry_options(PartitionOptions, None, {"input_ids": 1, "cuts": [2]}, keep=LAUNCHER_FIELDS)
    assert rest == {"input_ids": 1} and opts.cuts == [2]
    opts, rest = entry_options(PartitionOptions, None, {"input_ids": (4, 12)})
    assert rest == {} and opts.input_ids == (4, 12)


def test_one_rule_builds_every_entry_points_options():
    # partition() names its options with None meaning "not given" (its options' defaults are
    # "flops", "1f1b", 1); the launcher starts from its own defaults (4 micro-batches, SGD)
    from layerscope.torchrun import _launch_options
    opts, _ = entry_options(PartitionOptions, None, {}, stages=2, by=None, schedule=None, microbatches=None)
    assert (opts.stages, opts.by, opts.schedule, opts.microbatches) == (2, "flops", "1f1b", 1)
    launch = _launch_options(None, {"stages": 2, "microbatches": None, "partition_options": {"microbatches": 8}})
    assert (launch.stages, launch.microbatches, launch.optimizer) == (2, 8, "sgd")
    with pytest.raises(ls.InputError, match=r"^stages given both as a keyword and in options=$"):
        _launch_options(PartitionOptions(), {"stages": 2})


def test_unknown_schedule_is_one_line():
    with pytest.raises(ls.InputError, match="schedule must be one of gpipe, 1f1b, interleaved, zb, zbv"):
        PartitionOptions(schedule="dualpipev")


def test_schedule_table_drives_placement_and_names():
    assert ZERO_BUBBLE == ("zb", "zbv") and MULTI == ("interleaved", "zb", "zbv")
    assert schedule_of("zbv").ranks(4, 3) == 2 and schedule_of("interleaved").ranks(6, 3) == 2
    assert stage_ranks("zbv", 4) == [0, 1, 1, 0] and stage_ranks("zb", 4, 2) == [0, 1, 0, 1]
    assert all(schedule_of(n).torch_schedule().__name__ == s.torch_class for n, s in SCHEDULES.items())
    assert [a.kind for a in rank_orders("gpipe", 2, 2)[0]] == ["F", "F", "B", "B"]


def test_byte_and_bandwidth_parsing_live_in_options():
    from layerscope.render import units
    assert units.parse_bytes is parse_bytes and parse_bytes("1GiB") == 2 ** 30 and parse_bytes("2 GB") == 2 * 10 ** 9
    assert parse_bandwidth("50GB/s") == 50e9 and parse_bandwidth("2e12") == 2e12
    with pytest.raises(ValueError, match="not a bandwidth"):
        parse_bandwidth("fast")
