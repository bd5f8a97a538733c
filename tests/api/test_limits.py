"""Every input is bounded: size, depth, nodes and text after aliases, integers; bad ones are refused quickly
with one line naming the limit, never with a crash, a hang or gigabytes of memory."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from trainjob.api import TrainJob, load_resources, read_documents
from trainjob.api.limits import MAX_DEPTH, MAX_INPUT_BYTES, MAX_NODES
from trainjob.errors import ValidationError

JOB = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: mnist}}
spec:
  runtimeRef: {{name: torch-distributed}}
  trainer:
    command: {command}
    numNodes: {num_nodes}
"""


def billion_laughs(width: int = 9, levels: int = 9) -> str:
    """The 680-byte kind of bomb ("billion laughs"): each level lists ``width`` aliases of the level below."""
    items = [f"&l0 [{', '.join(['lol'] * width)}]"]
    items += [f"&l{n} [{', '.join([f'*l{n - 1}'] * width)}]" for n in range(1, levels + 1)]
    return f"[{', '.join(items)}]"


def merge_bomb(levels: int = 20) -> str:
    """Merge keys (``<<``) that double a mapping at every level."""
    items = ["&m0 {a: 1, b: 2}"] + [f"&m{n} {{<<: *m{n - 1}, x: [*m{n - 1}, *m{n - 1}]}}" for n in range(1, levels + 1)]
    return f"[{', '.join(items)}]"


def nested_lists(depth: int) -> list:
    out: list = []
    for _ in range(depth - 1):
        out = [out]
    return out


def refused(text: str) -> str:
    """The message ``load_resources(text)`` refuses ``text`` with, checked to come within a second."""
    start = time.perf_counter()
    with pytest.raises(ValidationError) as err:
        load_resources(text)
    # Real clock on purpose: guards that a hostile input is refused at its limit, not expanded for minutes.
    assert time.perf_counter() - start < 1.0
    return str(err.value)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (billion_laughs(), f"aliases expand it to more than {MAX_NODES:,} nodes, the limit"),
        (billion_laughs(width=2, levels=40), f"aliases expand it to more than {MAX_NODES:,} nodes, the limit"),
        (merge_bomb(), f"aliases expand it to more than {MAX_NODES:,} nodes, the limit"),
        (
            "[&s " + "x" * 1_000_000 + ", " + ", ".join(["*s"] * 20) + "]",
            "aliases expand its text to more than 8 MiB, the limit",
        ),
    ],
    ids=["billion-laughs", "deep-doubling", "merge-keys", "long-string"],
)
def test_alias_bomb_is_refused_quickly(command, message):
    assert message in refused(JOB.format(command=command, num_nodes=1))


def test_a_few_aliases_are_read_as_copies():
    (job,) = load_resources(JOB.format(command="[&c torchrun, *c, *c]", num_nodes=1))
    assert job.spec.trainer.command == ["torchrun"] * 3


@pytest.mark.parametrize("anchor", ["&a [*a]", "&a {b: *a}", "&a [x, [y, *a]]"])
def test_recursive_alias_is_refused(anchor):
    assert refused(JOB.format(command=anchor, num_nodes=1)).endswith("alias *a refers to a node that contains it")


def test_alias_to_no_anchor_is_refused():
    assert refused(JOB.format(command="[*nowhere]", num_nodes=1)).endswith("alias *nowhere refers to no anchor before it")


@pytest.mark.parametrize(
    "command",
    [
        "[" * 1_000 + "]" * 1_000,
        "{a: " * 1_000 + "1" + "}" * 1_000,
        "[" * 100_000,  # unclosed: refused at the limit, not when the parser gives up
        "[&d " + "[" * 60 + "]" * 60 + ", [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*d]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    ],
    ids=["flow-lists", "flow-mappings", "unclosed", "through-an-alias"],
)
def test_nesting_past_the_depth_limit_is_refused(command):
    assert f"deeper than {MAX_DEPTH} levels, the limit" in refused(JOB.format(command=command, num_nodes=1))


def test_block_nesting_past_the_depth_limit_is_refused():
    text = "".join(f"{'  ' * i}k{i}:\n" for i in range(MAX_DEPTH + 5)) + f"{'  ' * (MAX_DEPTH + 5)}leaf\n"
    assert f"nests deeper than {MAX_DEPTH} levels, the limit" in refused(text)


def test_nesting_within_the_limit_is_read():
    (documents,) = read_documents("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
    assert documents["a"] == nested_lists(MAX_DEPTH - 1)


def test_too_many_nodes_are_refused_even_without_aliases():
    text = JOB.format(command="\n" + "    - x\n" * (MAX_NODES + 1), num_nodes=1)
    assert f"it has more than {MAX_NODES:,} nodes, the limit" in refused(text)


def test_input_over_the_size_limit_is_refused(tmp_path: Path):
    big = JOB.format(command="[" + ", ".join(["x" * 1000] * 5000) + "]", num_nodes=1)
    path = tmp_path / "big.yaml"
    path.write_text(big, encoding="utf-8")
    size = f"{len(big.encode()) / 2**20:.3g} MiB"

    assert refused(big) == f"<text>: input is {size}; the limit is 4 MiB (split it into several files)"
    with pytest.raises(ValidationError) as err:
        load_resources(path)
    assert str(err.value) == f"{path}: input is {size}; the limit is 4 MiB (split it into several files)"
    with pytest.raises(ValidationError) as err:
        load_resources(io.StringIO(big + "#" * MAX_INPUT_BYTES), name="<stdin>")
    assert str(err.value) == "<stdin>: input is larger than 4 MiB; the limit is 4 MiB (split it into several files)"


@pytest.mark.parametrize(
    "num_nodes",
    ["9" * 5_000, "0x" + "f" * 20_000, str(2**63), str(-(2**63) - 1), "0b" + "1" * 100],
    ids=["past-4300-digits", "long-hex", "2^63", "below-int64", "long-binary"],
)
def test_integer_past_64_bits_is_refused(num_nodes):
    message = refused(JOB.format(command="[torchrun]", num_nodes=num_nodes))
    assert message.startswith("<text>: line 8, column 15: integer ")
    assert message.endswith("is out of range: Kubernetes integers are 64-bit (-9223372036854775808..9223372036854775807)")
    assert len(message) < 250


def test_largest_64_bit_integer_is_read_then_judged_by_the_field():
    with pytest.raises(ValidationError, match=r"spec.trainer.numNodes: must be <= 10000, got 9223372036854775807"):
        load_resources(JOB.format(command="[torchrun]", num_nodes=2**63 - 1))


@pytest.mark.parametrize("tag", ["!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1]", "!!pairs [a: 1]"])
def test_tags_for_values_json_cannot_hold_are_refused(tag):
    text = JOB.format(command="[torchrun]", num_nodes=1) + f"  labels: {{a: {tag}}}\n"
    assert "is not supported: Kubernetes objects hold only strings" in refused(text)


def test_timestamps_stay_strings_as_in_kubernetes():
    (job,) = load_resources(JOB.format(command="[torchrun, 2024-01-01]", num_nodes=1))
    assert isinstance(job, TrainJob) and job.spec.trainer.command == ["torchrun", "2024-01-01"]


def test_long_one_line_text_is_read_as_yaml_not_as_a_file_name():
    assert "nests deeper" in refused("[" * 300 + "]" * 300)  # not "File name too long"


def test_a_kind_that_is_not_a_string_is_a_validation_error():
    assert refused("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: [TrainJob]\n").startswith(
        "kind: must be one of TrainJob, TrainingRuntime, ClusterTrainingRuntime, got ['TrainJob']"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"spec": {"trainer": {"command": [["x"] * 10] * 10_000}}}, f"holds more than {MAX_NODES:,} values, the limit"),
        ({"spec": nested_lists(500)}, f"nests deeper than {MAX_DEPTH} levels, the limit"),
    ],
    ids=["shared-lists", "deep-lists"],
)
def test_the_same_limits_hold_for_python_data(data, message):
    with pytest.raises(ValidationError) as err:
        TrainJob.from_dict({"metadata": {"name": "a"}, **data})
    assert str(err.value) == message


def test_a_list_that_contains_itself_is_refused():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValidationError, match="nests deeper than"):
        TrainJob.from_dict({"metadata": {"name": "a"}, "spec": {"trainer": {"command": loop}}})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        # libyaml refuses the escape itself; PyYAML's own parser lets it through to the loader's check
        (JOB.format(command='[torchrun, "\\ud800"]', num_nodes=1), "<text>: line 7, column "),
        ("kind: TrainJob # \ud800", "<text>: cannot read: not valid Unicode text (a lone surrogate)"),
        (io.TextIOWrapper(io.BytesIO(b"kind: \xff\xfe"), encoding="utf-8"), "<stream>: cannot read: not UTF-8 text"),
    ],
    ids=["escaped-surrogate", "surrogate-in-text", "bytes-on-stdin"],
)
def test_text_that_is_not_unicode_is_refused(source, message):
    with pytest.raises(ValidationError) as err:
        load_resources(source)
    assert message in str(err.value).replace("not valid YAML: ", "")


@pytest.mark.parametrize("tagged", ["!!int x", "!!int ''", "!!float abc", "!!bool maybe", "!!int '0x'"])
def test_scalars_tagged_with_a_type_they_are_not_are_refused(tagged):
    value = tagged.split(" ", 1)[1].strip("'")
    assert refused(JOB.format(command="[torchrun]", num_nodes=tagged)) == (
        f"<text>: line 8, column 15: {value!r} is not a valid {tagged.split()[0]}"
    )
