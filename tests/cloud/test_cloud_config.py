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
