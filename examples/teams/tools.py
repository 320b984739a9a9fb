"""Python tools of the docs-review team: plain typed functions with a docstring."""


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text to count.
    """
    return len(text.split())
