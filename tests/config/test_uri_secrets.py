"""Tokens inside URIs (`?authz=`, `access_token=`, a signed URL's `sig=`, `user:password@`), in any key that holds
a URI: masked wherever a config or a file list is written or said, and a renewed token is the same run."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import yaml

from hpctrain.config.dump import config_hash, dump_config, to_yaml
from hpctrain.config.identity import differences
from hpctrain.config.loading import ConfigRequest, resolve_config
from hpctrain.config.secrets import MaskSecrets, mask_secrets, mask_tree
from hpctrain.data.fingerprint import FileList
from hpctrain.runtime.env import ClusterEnv
from hpctrain.train.entry import RunOutput
from hpctrain.workloads.registry import config_model, fill_default_types

TOKENS = ("hpctrainAuthz111", "hpctrainAccess222", "hpctrainSig333", "hpctrainPass444", "hpctrainKey555")


def uri_config(n: int = 0) -> tuple[object, object]:
    """A muon config with a token in every URI-holding key (`n`: which round of tokens, renewed)."""
    t = [f"{token}{'x' * n}" for token in TOKENS]
    overrides = [
        "data.type=muons",
        "model.type=muon_flow",
        f"data.paths=['pelican://fed.example/ns/a.parquet?authz={t[0]}', 'https://h/b.parquet?x=1&access_token={t[1]}']",
        f"checkpoint.mirror_to=https://acct.blob.example/c?sv=2020&sig={t[2]}",
        f"checkpoint.dir=pelican://fed.example/ns/ckpt?authz={t[0]}",
        f"checkpoint.resume=pelican://fed.example/ns/old/step_00000001.pt?authz={t[0]}",
        f"data.pelican.federation_url=https://me:{t[3]}@fed.example",
        f"logging.tensorboard.mirror_to=https://storage.example/tb?X-Goog-Signature={t[2]}&key={t[4]}",
    ]
    return resolve_config(
        ConfigRequest(None, None, overrides, None), config_model(), environ={}, prepare=fill_default_types
    )


def test_every_uri_key_is_masked_where_the_config_is_written() -> None:
    cfg, sources = uri_config()
    text = to_yaml(cfg)  # config.yaml, a checkpoint's config, W&B's config, an export's config.yaml
    assert not any(token in text for token in TOKENS), text
    tree = yaml.safe_load(text)
    assert tree["data"]["paths"][0] == "pelican://fed.example/ns/a.parquet?authz=***"
    assert tree["checkpoint"]["mirror_to"] == "https://acct.blob.example/c?sv=2020&sig=***"
    assert tree["data"]["pelican"]["federation_url"] == "https://me:***@fed.example"
    assert dump_config(cfg)["logging"]["tensorboard"]["mirror_to"].endswith("X-Goog-Signature=***&key=***")
    assert not any(token in (sources.naming or "") + cfg.run.name for token in TOKENS)  # said at start


def test_a_renewed_token_is_the_same_run() -> None:
    """The checkpoint keeps the masked config: a token renewed since (or an old checkpoint that kept it in
    clear) differs in nothing, names the same run folder, and records no change in chain.json."""
    old, _ = uri_config(0)
    new, _ = uri_config(1)
    assert differences(dump_config(old), new) == []
    assert differences(old.model_dump(mode="json"), new) == []  # a checkpoint written before the masking
    assert config_hash(old) == config_hash(new) and old.run.name == new.run.name
    assert mask_tree({"password": "x", "api_key": "**********", "n": [1, "a?token=y"]}) == {
        "password": "***",
        "api_key": "**********",
        "n": [1, "a?token=***"],
    }


def test_file_lists_in_checkpoints_keep_no_token(tmp_path: Path) -> None:
    uri = "pelican://fed.example/ns/d/{}.parquet?authz={}"
    files = FileList([uri.format(i, TOKENS[0]) for i in range(3)], [10, 20, 30], [1, 2, 3])
    state = files.state()
    assert TOKENS[0] not in repr(state) and state["names"][0] == "0.parquet?authz=***"
    renewed = FileList([uri.format(i, "renewed") for i in range(3)], [10, 20, 30], [1, 2, 3])
    assert renewed.changes(FileList.from_state(state)) is None
    assert renewed.changes(FileList.from_state(files.state() | {"names": ["0.parquet"] * 3})) is not None


def test_log_lines_and_said_lines_mask_tokens_in_uris(tmp_path: Path, capsys) -> None:
    """Whoever logs (a library's warning too) and whatever the run says: stderr and training.log hold no token."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(MaskSecrets())
    log = logging.getLogger("test_uri_secrets")
    log.addHandler(handler)
    try:
        log.warning("uploading to %s failed", f"https://h/x?sig={TOKENS[2]}&n=1")
        try:
            raise OSError(f"403 for pelican://f/ns/x?authz={TOKENS[0]}")
        except OSError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    assert not any(token in stream.getvalue() for token in TOKENS) and "sig=***&n=1" in stream.getvalue()
    out = RunOutput(ClusterEnv())
    try:
        out.say(f"mirror to https://me:{TOKENS[3]}@host/x")
        out.open(tmp_path)
        logging.getLogger("hpctrain.test").warning("copy to %s", f"osdf:///ns/x?authz={TOKENS[0]}")
    finally:
        out.close()
    written = (tmp_path / "training.log").read_text() + capsys.readouterr().out
    assert "https://me:***@host/x" in written and "authz=***" in written
    assert not any(token in written for token in TOKENS), written
    assert mask_secrets("s3://b/k?X-Amz-Signature=abc&X-Amz-Credential=def") == (
        "s3://b/k?X-Amz-Signature=***&X-Amz-Credential=***"
    )


def test_the_programs_tracebacks_and_stray_warnings_mask_tokens() -> None:
    """A crash (exit 1) prints its traceback masked, as every error line is; so is a warning of a verb that set up
    no logging of its own."""
    code = (
        "import logging\n"
        "from hpctrain import cli\n"
        "cli._masked_tracebacks()\n"
        "cli._masked_last_resort()\n"
        f"logging.getLogger('x').warning('to https://h/x?authz={TOKENS[0]}')\n"
        f"raise OSError('pelican://f/x?sig={TOKENS[2]}')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "OSError: pelican://f/x?sig=***" in done.stderr, done.stderr
    assert "to https://h/x?authz=***" in done.stderr and not any(t in done.stderr for t in TOKENS)
