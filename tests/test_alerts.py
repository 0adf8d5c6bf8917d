"""The docs' Prometheus alert rules: valid, each one fired by ``promtool test rules``, and shown on the
metrics page as the file is."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RULES = ROOT / "docs" / "alerts.yml"
UNIT_TESTS = ROOT / "tests" / "alerts" / "alerts_test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `make prometheus` installs Debian's (the tests need it)")
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=60, cwd=UNIT_TESTS.parent)


def test_the_rules_are_valid_and_each_alert_fires_in_promtool_s_tests():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", UNIT_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_severity_a_summary_and_a_test_that_fires_it():
    rules = RULES.read_text()
    alerts = re.findall(r"- alert: (\w+)", rules)
    assert len(alerts) == 7 and "KeyedQueueScrapeDown" in alerts
    for block in rules.split("- alert: ")[1:]:
        assert re.search(r"severity: (critical|warning)\n", block) and "summary: " in block, block
        assert "description: " in block, block
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", UNIT_TESTS.read_text()))
    assert fired == set(alerts), "each alert fires in a test"


def test_the_metrics_page_shows_the_rules_file_as_it_is():
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert f"```yaml\n{RULES.read_text()}```" in page
