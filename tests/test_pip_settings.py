"""launch.sh installs with uv and hands it pip's settings (engine/pip_settings.py): a machine whose pip reads its
packages from a mirror, a wheel folder or under a constraint gets the same from uv."""
from __future__ import annotations

import os
import subprocess
import sys

from engine.pip_settings import uv_arguments
from tests.conftest import ROOT


def test_each_setting_of_every_scope_becomes_uv_s_flag_once_in_order():
    lines = ["global.find-links='/opt/wheels'",
             "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
             "global.constraint='/etc/pip/constraints.txt'",
             "global.cert='/etc/ssl/certs/ca.crt'",            # not a flag: the launcher gives it as SSL_CERT_FILE
             ":env:.find-links='/opt/wheels'",                 # the same folder from PIP_FIND_LINKS: once
             "user.index-url='https://mirror.example/simple'",
             "site.trusted-host='mirror.example'",
             "global.timeout='180'",
             "broken line without a value"]
    assert uv_arguments(lines) == ["--find-links", "/opt/wheels",
                                   "--extra-index-url", "file:///opt/a/simple",
                                   "--extra-index-url", "file:///opt/b/simple",
                                   "--constraint", "/etc/pip/constraints.txt",
                                   "--index-url", "https://mirror.example/simple",
                                   "--allow-insecure-host", "mirror.example"]


def test_no_index_is_kept_only_when_it_is_on():
    assert uv_arguments([":env:.no-index='1'"]) == ["--no-index"]
    assert uv_arguments(["global.no-index='false'"]) == []


def test_the_launcher_s_command_reads_pip_s_own_configuration(tmp_path):
    """What launch.sh runs, on a pip configuration file of the test's own and a PIP_ variable."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nfind-links = /srv/wheels\nextra-index-url =\n    https://one.example/simple\n"
                      "    https://two.example/simple\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(config), PIP_CONSTRAINT="/srv/constraints.txt")
    done = subprocess.run([sys.executable, "-m", "engine.pip_settings"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[words.index("--find-links") + 1] == "/srv/wheels"
    assert [words[i + 1] for i, word in enumerate(words) if word == "--extra-index-url"] == [
        "https://one.example/simple", "https://two.example/simple"]
    assert words[words.index("--constraint") + 1] == "/srv/constraints.txt"
