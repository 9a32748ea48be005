"""The kinds of inner optimizer (`wrapping.KINDS`), one module each."""
