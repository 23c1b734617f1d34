"""The first-error analyzer: phases, the root-cause line, category and secondary OOM of a vLLM log,
streaming or on files. The knowledge is data (rules.toml); this package is the machinery."""

from kernel.analyzer.reader import InputError
from kernel.analyzer.rules import Rules, RulesError, default_rules, load_rules
from kernel.analyzer.stream import ErrorFinding, PhaseFinding, Stall, StreamAnalyzer
from kernel.analyzer.whole_log import Analysis, analyze_lines, analyze_path, analyze_stream, analyze_text

__all__ = [
    "Analysis",
    "ErrorFinding",
    "InputError",
    "PhaseFinding",
    "Rules",
    "RulesError",
    "Stall",
    "StreamAnalyzer",
    "analyze_lines",
    "analyze_path",
    "analyze_stream",
    "analyze_text",
    "default_rules",
    "load_rules",
]
