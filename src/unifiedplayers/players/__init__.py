"""The three players (SPEC §1): prompts, parsing of their outputs, and the Execution tool loop."""
