"""cloudd options: tokens from flags and a TOML file, and refusals that name the problem."""

from __future__ import annotations

import pytest

from cloud.config import ConfigError, load_tokens_file
from cloud.server import main, parse_args


def test_tokens_file_and_flags_merge(tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[gateways]\ngw1 = "from-file"\ngw2 = "two"\n')
    config = parse_args(
        [
            "--data-dir",
            str(tmp_path),
            "--tokens-file",
            str(tokens),
            "--token",
            "gw1=flag",
            "--operator-token",
            "op",
            "--port",
            "0",
        ]
    )
    assert config.gateway_tokens == {"gw1": "flag", "gw2": "two"}  # a flag overrides the file
    assert (config.operator_token, config.port) == ("op", 0)


@pytest.mark.parametrize(
    "text, names",
    [
        ('gw1 = "x"\n', "[gateways]"),
        ("[gateways]\ngw1 = 5\n", "gateways.gw1"),
        ('[gateways]\n"bad/id" = "x"\n', "bad/id"),
        ("[gateways\n", "tokens"),
    ],
)
def test_bad_tokens_file_is_named(tmp_path, text, names):
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_tokens_file(path)
    assert names in str(info.value)


def test_bad_token_flag_exits_2(tmp_path, capsys):
    assert main(["--data-dir", str(tmp_path), "--token", "gw1"]) == 2
    assert "GATEWAY=TOKEN" in capsys.readouterr().err


def test_database_from_the_toml_file_and_the_flag(tmp_path):
    tokens = tmp_path / "cloudd.toml"
    tokens.write_text('[gateways]\ngw1 = "t"\n[database]\nurl = "postgresql://u:pw@db:5432/e"\n')
    assert parse_args(["--data-dir", str(tmp_path), "--tokens-file", str(tokens)]).database == (
        "postgresql://u:pw@db:5432/e"
    )
    flag = ["--database", "postgresql://other@db/e"]
    assert parse_args(["--data-dir", str(tmp_path), "--tokens-file", str(tokens), *flag]).database == (
        "postgresql://other@db/e"  # the flag overrides the file
    )
    assert parse_args(["--data-dir", str(tmp_path)]).database is None  # the SQLite file


@pytest.mark.parametrize(
    "args, names",
    [
        (["--database", "mysql://db/e"], "--database"),
        (["--tokens-file", "{toml}"], "database.url"),
    ],
)
def test_bad_database_url_exits_2_naming_it(tmp_path, capsys, args, names):
    toml = tmp_path / "cloudd.toml"
    toml.write_text('[gateways]\ngw1 = "t"\n[database]\nurl = 5\n')
    argv = ["--data-dir", str(tmp_path), *(a.format(toml=toml) for a in args)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and names in err


def test_unreachable_database_exits_1_with_one_line_and_no_password(tmp_path):
    from tests.harness.processes import free_port, run_module

    url = f"postgresql://cloudd:s3cret@127.0.0.1:{free_port()}/edgefed"
    done = run_module("cloud.server", ["--data-dir", str(tmp_path / "d"), "--database", url, "--port", "0"])
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("cloudd:")]
    assert len(lines) == 1 and "connection" in lines[0].lower() and "127.0.0.1" in lines[0]
    assert "s3cret" not in done.stderr
