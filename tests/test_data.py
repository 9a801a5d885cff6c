"""`repexp data prepare`: paper splits, seeding, byte determinism, sources, bad input, overlap checks."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from repexp import cli, data, splits
from repexp.data import DataError, Options, prepare

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def math_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("math")
    manifest = prepare("math", out, source=str(DATA), options=Options(seed=0))
    return out, manifest


@pytest.fixture(scope="module")
def gsm8k_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("gsm8k")
    manifest = prepare("gsm8k", out, source=str(DATA), options=Options(seed=0))
    return out, manifest


# --------------------------------------------------------------------------- the paper's splits


def test_math_splits_are_the_papers(math_out):
    out, manifest = math_out
    split_rows = {name: rows_of(out / f"{name}.parquet") for name in data.SPLITS}
    assert {k: len(v) for k, v in split_rows.items()} == {"train": 7494, "dev": 500, "test": 4500}
    assert {(d["problem_id"], d["reason"]) for d in manifest["dropped"]} == {
        ("math/train/5341", "empty ground truth"),  # train/number_theory/7115: \boxed{}
        ("math/train/5343", "empty ground truth"),  # train/number_theory/7117: \boxed{}
        ("math/train/2948", "problem text also in dev/test"),  # = test/precalculus/24307
        # the same problems typeset differently (spacing, x^{2} vs x^2, "12.$" vs "12$."): issue #16
        ("math/train/750", "problem text also in dev/test"),  # = test/intermediate_algebra/965 (math/test/3023)
        ("math/train/1414", "problem text also in dev/test"),  # = test/algebra/636 (math/test/1038)
        ("math/train/1598", "problem text also in dev/test"),  # = test/algebra/1674 (math/test/311)
    }
    math500 = jsonl(DATA / "math500" / "test.jsonl")
    assert {r["extra_info"]["question"] for r in split_rows["dev"]} == {r["problem"] for r in math500}
    assert split_rows["dev"][0]["extra_info"]["problem_id"] == "math/test/4"  # test/precalculus/807
    dev_ids = {r["extra_info"]["problem_id"] for r in split_rows["dev"]}
    test_ids = {r["extra_info"]["problem_id"] for r in split_rows["test"]}
    assert not dev_ids & test_ids and len(dev_ids | test_ids) == 5000
    answers = {f"math/test/{i}": r["answer"].strip() for i, r in enumerate(jsonl(DATA / "math" / "test.jsonl"))}
    for row in split_rows["dev"] + split_rows["test"]:
        assert row["reward_model"] == {"style": "rule", "ground_truth": answers[row["extra_info"]["problem_id"]]}
    row = split_rows["train"][0]
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval" and row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": row["extra_info"]["question"] + " " + data.MATH_INSTRUCTION}]
    assert set(row["extra_info"]) == {"split", "index", "problem_id", "source", "source_split", "question", "solution",
                                      "level", "subject"}
    assert [r["extra_info"]["index"] for r in split_rows["dev"]][:3] == [4, 6, 15]  # upstream's DEV_INDICES start
    assert manifest["splits"]["dev"]["sha256"] == sha256(out / "dev.parquet")
    math_test_sha256 = "f0f79583ec017aa22be99afb4cdf582013ab5c4a0def3b6c8bfbd51480ad7644"
    assert manifest["inputs"]["math_test"]["sha256"] == math_test_sha256


def test_gsm8k_dev_is_seeded_and_outputs_are_byte_deterministic(gsm8k_out, tmp_path):
    out, manifest = gsm8k_out
    dev, test = rows_of(out / "dev.parquet"), rows_of(out / "test.parquet")
    assert (len(dev), len(test), manifest["splits"]["train"]["rows"]) == (512, 807, 7473)
    ids = [r["extra_info"]["problem_id"] for r in dev + test]
    assert len(set(ids)) == 1319 and set(ids) == {f"gsm8k/test/{i}" for i in range(1319)}
    assert all("," not in r["reward_model"]["ground_truth"] for r in dev + test)
    assert dev[0]["prompt"][0]["content"].endswith(data.GSM8K_INSTRUCTION)

    again = prepare("gsm8k", tmp_path / "again", source=str(DATA), options=Options(seed=0))
    for name in ("train.parquet", "dev.parquet", "test.parquet"):
        assert sha256(tmp_path / "again" / name) == sha256(out / name), name
    assert again["splits"] == manifest["splits"]

    other = prepare("gsm8k", tmp_path / "seed1", source=str(DATA), options=Options(seed=1))
    other_dev = {r["extra_info"]["problem_id"] for r in rows_of(tmp_path / "seed1" / "dev.parquet")}
    assert other["splits"]["dev"]["rows"] == 512 and other_dev != {r["extra_info"]["problem_id"] for r in dev}
    assert sha256(tmp_path / "seed1" / "train.parquet") == sha256(out / "train.parquet")  # train does not use the seed


def test_aime24_dev_equals_test_and_never_touches_train(tmp_path):
    manifest = prepare("aime24", tmp_path, source=str(DATA), options=Options(seed=0))
    dev, test = rows_of(tmp_path / "dev.parquet"), rows_of(tmp_path / "test.parquet")
    key = lambda rows: [(r["extra_info"]["problem_id"], r["reward_model"]["ground_truth"], r["prompt"]) for r in rows]  # noqa: E731
    assert key(dev) == key(test) and len(dev) == 30 and manifest["dev_equals_test"]
    truths = dict((pid, gt) for pid, gt, _ in key(dev))
    assert truths["aime24/2024-I-1"] == "204" and truths["aime24/2024-II-4"] == "33"  # "033" in the file
    assert [pid for pid, _, _ in key(dev)][:2] == ["aime24/2024-I-1", "aime24/2024-I-2"]  # contest order
    assert {r["data_source"] for r in dev} == {"aime24"}
    train = rows_of(tmp_path / "train.parquet")
    assert len(train) == 7498 and train[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in dev}


# --------------------------------------------------------------------------- DAPO


def test_dapo_with_aime24_without_a_dapo_source_names_what_is_missing(tmp_path, capsys):
    with pytest.raises(DataError, match=r"missing DAPO source.*data.dapo_source"):
        prepare("dapo-with-aime24", tmp_path / "out", source=str(DATA), options=Options())
    assert not (tmp_path / "out").exists()  # nothing written
    rc = cli.main(["data", "prepare", "dapo-with-aime24", "--set", f"data.source={DATA}",
                   "--out", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "missing DAPO source" in err and "ftajwar/deduplicated_dapo_dataset" in err and "Traceback" not in err


def _synthetic_dapo(path: Path, n: int = 5000) -> tuple[Path, str]:
    """A DAPO-like file: `prompt` + `answer` rows, one leaking an AIME problem, one without an answer."""
    aime_text = jsonl(DATA / "aime24" / "test.jsonl")[0]["problem"]
    rows = [{"prompt": f"Compute {i} + {i * 7}.", "answer": str(8 * i)} for i in range(n)]
    rows[10] = {"prompt": aime_text, "answer": "204"}
    rows[20] = {"prompt": "A problem nobody answered.", "answer": ""}
    return write_jsonl(path, rows), aime_text


def test_dapo_subset_is_a_seeded_4096_problem_draw(tmp_path):
    dapo_file, _ = _synthetic_dapo(tmp_path / "dapo.jsonl")
    manifest = prepare("dapo-with-aime24", tmp_path / "s0", source=str(DATA), options=Options(seed=0),
                       dapo_source=str(dapo_file))
    train = rows_of(tmp_path / "s0" / "train.parquet")
    assert len(train) == 4096 and manifest["options"]["dapo_train_size"] == 4096
    assert {(d["problem_id"], d["reason"]) for d in manifest["dropped"]} == {
        ("dapo/train/20", "empty ground truth"),
        ("dapo/train/10", "problem text also in dev/test"),
    }
    ids = [r["extra_info"]["problem_id"] for r in train]
    # exactly the seeded draw of splits.train_subset over the pool left after the drops, in pool order
    pool = [f"dapo/train/{i}" for i in range(5000) if i not in (10, 20)]
    assert ids == [pool[i] for i in splits.train_subset(len(pool), 4096, seed=0)]
    assert {r["data_source"] for r in train} == {"math_dapo"}
    assert train[0]["reward_model"]["ground_truth"] == str(8 * int(ids[0].rsplit("/", 1)[1]))
    assert manifest["inputs"]["dapo"]["sha256"] == sha256(dapo_file)

    prepare("dapo-with-aime24", tmp_path / "again", source=str(DATA), options=Options(seed=0),
            dapo_source=str(dapo_file))
    assert sha256(tmp_path / "again" / "train.parquet") == sha256(tmp_path / "s0" / "train.parquet")
    prepare("dapo-with-aime24", tmp_path / "s1", source=str(DATA), options=Options(seed=1), dapo_source=str(dapo_file))
    other = [r["extra_info"]["problem_id"] for r in rows_of(tmp_path / "s1" / "train.parquet")]
    assert len(other) == 4096 and other != ids

    # a tiny CPU run: a seeded subset of that subset
    prepare("dapo-with-aime24", tmp_path / "tiny", source=str(DATA), options=Options(seed=0, limit_train=16),
            dapo_source=str(dapo_file))
    tiny = [r["extra_info"]["problem_id"] for r in rows_of(tmp_path / "tiny" / "train.parquet")]
    assert len(tiny) == 16 and set(tiny) <= set(ids)


def test_dapo_source_as_parquet_and_too_small_pools(tmp_path):
    rows = [{"problem": f"Find {i}.", "answer": i} for i in range(300)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "dapo.parquet")
    options = Options(seed=3, dapo_train_size=100)
    prepare("dapo-with-aime24", tmp_path / "out", source=str(DATA), options=options,
            dapo_source=str(tmp_path / "dapo.parquet"))
    train = rows_of(tmp_path / "out" / "train.parquet")
    assert len(train) == 100
    assert train[0]["reward_model"]["ground_truth"] == train[0]["extra_info"]["problem_id"].rsplit("/", 1)[1]
    with pytest.raises(DataError, match=r"dapo\.parquet: the training pool has 300 rows, fewer than the 4096"):
        prepare("dapo-with-aime24", tmp_path / "bad", source=str(DATA), options=Options(),
                dapo_source=str(tmp_path / "dapo.parquet"))
    # aime24 trains on MATH by default, on DAPO when configured
    prepare("aime24", tmp_path / "aime_dapo", source=str(DATA),
            options=Options(seed=3, dapo_train_size=100, aime_train="dapo"), dapo_source=str(tmp_path / "dapo.parquet"))
    assert len(rows_of(tmp_path / "aime_dapo" / "train.parquet")) == 100


# --------------------------------------------------------------------------- limits, CLI


def test_limits_are_seeded_subsets_of_the_full_splits(gsm8k_out, tmp_path, capsys):
    full_out, _ = gsm8k_out
    argv = ["data", "prepare", "gsm8k", "--set", f"data.source={DATA}", "data.split_seed=0",
            "data.limit_train=8", "data.limit_dev=4", "data.limit_test=5"]
    assert cli.main(argv + ["--out", str(tmp_path / "a")]) == 0
    assert "gsm8k: wrote" in capsys.readouterr().out
    assert cli.main(argv + ["--out", str(tmp_path / "b")]) == 0
    for name, size in (("train", 8), ("dev", 4), ("test", 5)):
        small = rows_of(tmp_path / "a" / f"{name}.parquet")
        full_ids = {r["extra_info"]["problem_id"] for r in rows_of(full_out / f"{name}.parquet")}
        assert len(small) == size and {r["extra_info"]["problem_id"] for r in small} <= full_ids
        assert sha256(tmp_path / "a" / f"{name}.parquet") == sha256(tmp_path / "b" / f"{name}.parquet")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["options"]["limit_dev"] == 4 and manifest["seed"] == 0


# --------------------------------------------------------------------------- one path after loading


def _hub_from_local(dataset_id, config, split):
    """Rows shaped as `datasets.load_dataset` returns them, built from the offline copies."""
    if dataset_id == "DigitalLearningGmbH/MATH-lighteval":  # no answer / unique_id columns on the Hub
        return [{k: r[k] for k in ("problem", "level", "solution", "type")}
                for r in jsonl(DATA / "math" / f"{split}.jsonl")]
    if dataset_id == "HuggingFaceH4/MATH-500":
        return jsonl(DATA / "math500" / "test.jsonl")
    if dataset_id.startswith("MathArena/aime_2024_"):  # integer answers, problem_idx, no url
        part = dataset_id.rsplit("_", 1)[1]
        rows = [r for r in jsonl(DATA / "aime24" / "test.jsonl") if f"AIME_{part}_Problems" in r["url"]]
        return [{"problem_idx": int(r["url"].rsplit("_", 1)[1]), "problem": r["problem"], "answer": int(r["answer"])}
                for r in rows]
    raise AssertionError(f"unexpected dataset {dataset_id}")


def test_hub_shaped_rows_take_the_same_path_as_local_files(math_out, tmp_path):
    out, _ = math_out
    tables = data.load_hf(data.tables_needed("math", Options()), loader=_hub_from_local)
    assert tables["math_test"].origin == "hf:DigitalLearningGmbH/MATH-lighteval:default/test"
    manifest = prepare("math", tmp_path / "hf", source="hf", options=Options(seed=0), tables=tables)
    assert "matched by problem text" in manifest["notes"][0]  # no unique_id on the Hub: text matching
    for name in ("train.parquet", "dev.parquet", "test.parquet"):
        assert sha256(tmp_path / "hf" / name) == sha256(out / name), name

    aime_tables = data.load_hf(["aime24"], loader=_hub_from_local)
    aime_tables.update(data.load_local(["math_train"], DATA))
    prepare("aime24", tmp_path / "aime_hf", source="hf", options=Options(), tables=aime_tables)
    prepare("aime24", tmp_path / "aime_local", source=str(DATA), options=Options())

    def key(p):
        return [(r["extra_info"]["problem_id"], r["reward_model"]["ground_truth"], r["prompt"]) for r in rows_of(p)]

    assert key(tmp_path / "aime_hf" / "test.parquet") == key(tmp_path / "aime_local" / "test.parquet")


# --------------------------------------------------------------------------- bad input


@pytest.fixture
def small_gsm8k(tmp_path):
    source = tmp_path / "source"
    for split in ("train", "test"):
        rows = jsonl(DATA / "gsm8k" / f"{split}.jsonl")[:40]
        write_jsonl(source / "gsm8k" / f"{split}.jsonl", rows)
    return source


def _prepare_small(source, out, **kw):
    return prepare("gsm8k", out, source=str(source), options=Options(seed=0, gsm8k_dev_size=10, **kw))


def test_bad_or_missing_input_files_are_named(small_gsm8k, tmp_path):
    _prepare_small(small_gsm8k, tmp_path / "ok")  # the fixture itself is fine
    test_file = small_gsm8k / "gsm8k" / "test.jsonl"
    good = test_file.read_text()
    lines = good.splitlines(keepends=True)

    test_file.write_text("".join(lines[:2]) + "{not json\n" + "".join(lines[3:]))
    with pytest.raises(DataError, match=r"gsm8k/test\.jsonl:3: not valid JSON"):
        _prepare_small(small_gsm8k, tmp_path / "out")

    test_file.write_text(json.dumps({"query": "no question field", "answer": "#### 1"}) + "\n" + good)
    with pytest.raises(DataError, match=r"gsm8k/test\.jsonl, row 0: missing field 'question'"):
        _prepare_small(small_gsm8k, tmp_path / "out")

    test_file.write_text(json.dumps({"question": "q?", "answer": "no marker"}) + "\n" + good)
    with pytest.raises(DataError, match=r"row 0: answer has no '#### <number>' line"):
        _prepare_small(small_gsm8k, tmp_path / "out")

    test_file.unlink()
    with pytest.raises(FileNotFoundError, match=r"gsm8k/test\.jsonl: file not found"):
        _prepare_small(small_gsm8k, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # every failure happens before anything is written

    with pytest.raises(FileNotFoundError, match="nowhere: data source directory not found"):
        prepare("gsm8k", tmp_path / "out", source=str(tmp_path / "nowhere"), options=Options())


def test_a_modified_file_is_caught_by_the_data_manifest(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(DATA / "aime24", source / "aime24")
    shutil.copytree(DATA / "math", source / "math")
    shutil.copy(DATA / "MANIFEST.json", source / "MANIFEST.json")
    path = source / "aime24" / "test.jsonl"
    path.chmod(0o644)
    text = path.read_text()
    assert '"answer":"204"' in text
    path.write_text(text.replace('"answer":"204"', '"answer":"205"'))
    with pytest.raises(DataError, match=r"aime24/test\.jsonl: sha256 .* differs from MANIFEST\.json"):
        prepare("aime24", tmp_path / "out", source=str(source), options=Options())


def test_train_rows_leaking_into_test_are_dropped_and_dev_test_overlap_is_an_error(small_gsm8k, tmp_path):
    train_file = small_gsm8k / "gsm8k" / "train.jsonl"
    test_rows = jsonl(small_gsm8k / "gsm8k" / "test.jsonl")
    leaked = {**test_rows[7], "question": "  " + test_rows[7]["question"].upper() + " "}  # same text up to case/space
    write_jsonl(train_file, jsonl(train_file) + [leaked])
    manifest = _prepare_small(small_gsm8k, tmp_path / "out")
    assert manifest["dropped"] == [{"problem_id": "gsm8k/train/40", "reason": "problem text also in dev/test",
                                    "split": "train"}]

    # dev and test drawn from a test set with a duplicated problem: refused, not silently kept
    write_jsonl(small_gsm8k / "gsm8k" / "test.jsonl", [test_rows[0]] * 4)
    with pytest.raises(splits.SplitError, match="dev/test: .* shared problem texts"):
        prepare("gsm8k", tmp_path / "dup", source=str(small_gsm8k), options=Options(gsm8k_dev_size=2))


# --------------------------------------------------------------------------- pure split logic


def test_seeded_subsets_are_reproducible_sorted_and_stream_independent():
    a = splits.seeded_subset(1319, 512, seed=0, stream="gsm8k/dev")
    assert a == splits.seeded_subset(1319, 512, seed=0, stream="gsm8k/dev") and a == sorted(a) and len(set(a)) == 512
    assert a != splits.seeded_subset(1319, 512, seed=1, stream="gsm8k/dev")
    assert a != splits.seeded_subset(1319, 512, seed=0, stream="limit/dev")
    assert splits.seeded_subset(10, None, 0, "x") == list(range(10)) == splits.seeded_subset(10, 99, 0, "x")
    subset = splits.seeded_subset(4, 2, 0, "limit/test")
    assert splits.limit([5, 7, 9, 11], 2, 0, "limit/test") == [[5, 7, 9, 11][i] for i in subset]
    dev, test = splits.seeded_dev_test(1319, 512, seed=0)
    assert dev == a and len(test) == 807 and not set(dev) & set(test)
    with pytest.raises(splits.SplitError, match="fewer than the 4096"):
        splits.train_subset(100, 4096, seed=0)
    with pytest.raises(splits.SplitError, match="dev size 0"):
        splits.seeded_dev_test(10, 0, seed=0)


def test_membership_split_and_overlap_checks():
    inside, outside = splits.split_by_membership(["a", "b", "c", "d"], ["c", "a"], what="toy")
    assert (inside, outside) == ([0, 2], [1, 3])
    with pytest.raises(splits.SplitError, match="toy: 1 dev keys not found"):
        splits.split_by_membership(["a", "b"], ["a", "z"], what="toy")
    rows = lambda *pairs: [splits.SplitRow(pid, text) for pid, text in pairs]  # noqa: E731
    splits.check_disjoint({"train": rows(("t/1", "x")), "dev": rows(("d/1", "y")), "test": rows(("d/1", "y"))},
                          may_share=[("dev", "test")])
    with pytest.raises(splits.SplitError, match="train/test: 0 shared problem_ids, 1 shared problem texts"):
        splits.check_disjoint({"train": rows(("t/1", "Same  Text")), "test": rows(("s/1", "same text"))})
    with pytest.raises(splits.SplitError, match="dev/test: 1 shared problem_ids"):
        splits.check_disjoint({"dev": rows(("p/1", "a")), "test": rows(("p/1", "b"))})
    with pytest.raises(splits.SplitError, match="problem_id 'p/1' occurs twice"):
        splits.check_disjoint({"train": rows(("p/1", "a"), ("p/1", "b"))})
