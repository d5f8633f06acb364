"""The configuration reference (docs/configuration.md) is generated and kept in sync."""

from __future__ import annotations

import re
from pathlib import Path

from streamrag.config import reference_markdown

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "configuration.md"


def test_config_reference_is_current() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", text, re.S
    )
    assert found, "docs/configuration.md lacks the config-reference markers"
    assert found.group(1).strip() == reference_markdown().strip(), (
        "docs/configuration.md is stale: paste streamrag.config.reference_markdown() into it"
    )


def test_readme_links_resolve() -> None:
    """Every relative link of the README and of docs/ names a file that exists."""
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "broken links: " + ", ".join(broken)


def test_readme_shows_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text
    assert "make test" in text


def test_readme_starts_with_the_commands_and_own_data() -> None:
    """What a user needs first comes first: the two commands, then their own data."""
    heads = re.findall(r"(?m)^## (.+)$", README.read_text(encoding="utf-8"))
    assert heads[:2] == ["The two commands", "Your own data"]


def test_every_config_of_your_own_data_loads(tmp_path: Path) -> None:
    """The copy-pasteable configs of "Your own data" are valid settings."""
    from streamrag.config import load_settings

    text = README.read_text(encoding="utf-8")
    section = text.split("## Your own data", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    assert len(blocks) >= 5
    for i, block in enumerate(blocks):
        path = tmp_path / f"{i}.yaml"
        path.write_text(block, encoding="utf-8")
        settings = load_settings(path, environ={})
        assert settings.sources, block
