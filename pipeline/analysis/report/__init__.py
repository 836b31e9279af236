"""The staleness report: data from the lake, matplotlib figures, one self-contained HTML file."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'QUERIES': 'data',
    'gather': 'data',
    'parse_steps': 'data',
    'ReportError': 'data',
    'FIGURES': 'figures',
    'png_base64': 'figures',
    'render': 'html',
})
