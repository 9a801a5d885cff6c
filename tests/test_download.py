"""Downloads once, on the submit host (`repexp download`; docs/pipeline.md, "Downloads").

No Hugging Face Hub is reachable here, so the Hub's side is what the offline copies hold: the
GSM8K files under ../shared/data are verified identical to `openai/gsm8k` (their MANIFEST.json).
Tested: the JSONL layout and MANIFEST.json that `download data` writes from the rows the Hub
returns, and that `repexp data prepare` on that directory produces byte-identical splits to the
offline source; the model download's local-path contract is tested through the DAG in
tests/test_workflow.py. Not run: an actual transfer from the Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

from repexp import data, download

REPO = Path(__file__).resolve().parents[1]
OFFLINE = REPO.parent / "shared" / "data"


def offline_hub(dataset_id: str, config, split: str) -> list[dict]:
    """`datasets.load_dataset(dataset_id, config, split=split)` rows, as the offline copies hold them."""
    assert (dataset_id, config) == ("openai/gsm8k", "main"), dataset_id
    return data.read_jsonl(OFFLINE / "gsm8k" / f"{split}.jsonl")


def test_data_files_follow_the_tasks_and_sources():
    assert download.data_files(["gsm8k"], source_hf=True, dapo_hf=False) == ["gsm8k/train.jsonl", "gsm8k/test.jsonl"]
    assert download.data_files(["math", "dapo-with-aime24"], source_hf=True, dapo_hf=True) == [
        "math/train.jsonl", "math/test.jsonl", "math500/test.jsonl", download.DAPO_FILE, "aime24/test.jsonl"]
    assert download.data_files(["dapo-with-aime24"], source_hf=False, dapo_hf=True) == [download.DAPO_FILE]


def test_downloaded_tables_are_a_local_source_that_prepares_identical_splits(tmp_path):
    out = tmp_path / "downloads"
    manifest = download.download_data(["gsm8k"], out, tables=True, dapo=False, loader=offline_hub)
    assert [entry["path"] for entry in manifest["files"]] == ["gsm8k/train.jsonl", "gsm8k/test.jsonl"]
    assert json.loads((out / download.MANIFEST).read_text()) == manifest
    assert manifest["files"][0]["rows"] == 7473 and manifest["files"][0]["hf_origin"] == "hf:openai/gsm8k:main/train"

    options = data.Options(seed=0, limit_train=64, limit_dev=16, limit_test=16)
    ours = data.prepare("gsm8k", tmp_path / "from_download", source=str(out), options=options)
    reference = data.prepare("gsm8k", tmp_path / "from_offline", source=str(OFFLINE), options=options)
    for split in data.SPLITS:
        assert ours["splits"][split]["sha256"] == reference["splits"][split]["sha256"], split

    # the manifest guards the files: a modified download is refused, naming the file
    (out / "gsm8k" / "test.jsonl").write_text((OFFLINE / "gsm8k" / "test.jsonl").read_text().replace("72", "73"))
    try:
        data.prepare("gsm8k", tmp_path / "again", source=str(out), options=options)
    except data.DataError as err:
        assert "gsm8k/test.jsonl" in str(err) and "MANIFEST.json" in str(err)
    else:
        raise AssertionError("a modified download was accepted")
