"""Tests for tf_lso._migration.rules."""

import doctest
import pathlib
import re

import migration_util

import tf_lso
from tf_lso._migration import rules

MIGRATION = pathlib.Path(__file__).parents[1] / "docs" / "migration.md"


def test_doctests():
    assert doctest.testmod(rules).failed == 0


def test_every_rule_links_to_a_section_of_the_migration_guide():
    headings = re.findall(r"^#+ (.+)$", MIGRATION.read_text(), re.M)
    anchors = {rules.anchor(h) for h in headings}
    for rule in rules.RULES.values():
        assert rules.anchor(rule.section) in anchors, rule
        assert rule.severity in rules.SEVERITIES
        row = f"| `{rule.id}` | {rule.severity} | {rule.summary} |"
        assert row in MIGRATION.read_text(), rule.id


@migration_util.needs_tensorflow
def test_every_replacement_exists_in_tf_lso():
    for new in list(rules.LEGACY_NAMES.values()) + list(
            rules.LEGACY_MODULES.values()):
        value = tf_lso
        for part in new.split(".")[1:]:
            value = getattr(value, part)
        assert value is not None, new


@migration_util.needs_tensorflow
def test_every_name_install_provides_is_known():
    from tf_lso._src.legacy_api import install as install_lib

    for name in install_lib.installed_names():
        assert rules.replacement(name) is not None, name
        assert rules.is_legacy(name)


def test_canonical_spellings():
    assert rules.canonical("tensorflow") == "tf"
    assert rules.canonical("tensorflow.compat.v2.train") == "tf.train"
    assert rules.canonical("keras.mixed_precision") == "tf.keras.mixed_precision"
    assert rules.canonical("kerasx.y") == "kerasx.y"
    assert rules.canonical("tensorflow_addons") == "tensorflow_addons"
