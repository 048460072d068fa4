"""The summary rendered: the HTML report card and the terminal tables."""
