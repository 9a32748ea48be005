"""Tests for tf_lso_migration.legacy_names: the one table of legacy names."""

import doctest

import migration_util

import tf_lso
from tf_lso_migration import legacy_names as rules


def test_doctests():
    assert doctest.testmod(rules).failed == 0


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
