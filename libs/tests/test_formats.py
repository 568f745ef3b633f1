"""meshkit.text.formats: the one format detector, light enough for the CLI to import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshkit.text.formats import detect_format
from ragmesh.ingestion.v1 import ingestion_pb2

HEAVY = ("pdfplumber", "pdfminer", "bs4", "markdownify", "services.ingestion.normalize")


def loaded_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a/b/Guide.MD", ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN),
        ("notes.mdx", ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN),
        ("readme.rst", ingestion_pb2.DOCUMENT_FORMAT_TEXT),
        ("C:\\docs\\page.htm", ingestion_pb2.DOCUMENT_FORMAT_HTML),
        ("paper.pdf", ingestion_pb2.DOCUMENT_FORMAT_PDF),
    ],
)
def test_extension_names_the_format(name: str, expected: int) -> None:
    assert detect_format(name, b"anything") == expected


def test_pdf_magic_without_extension_and_unknown() -> None:
    assert detect_format("scan", b"  %PDF-1.7\n...") == ingestion_pb2.DOCUMENT_FORMAT_PDF
    assert detect_format("data.bin", b"\x00\x01") is None
    assert detect_format("Makefile", b"all:") is None


def test_the_normaliser_uses_the_shared_detector() -> None:
    from services.ingestion import normalize

    assert normalize.detect_format is detect_format


def test_detection_imports_no_parser() -> None:
    assert loaded_after("from meshkit.text.formats import detect_format") == []


def test_ragmesh_ingest_detects_formats_without_the_normaliser() -> None:
    """The CLI's detector (ragmesh_cli.ingest.load_detector) and its parser load no document
    parser: a folder walk does not pay for pdfplumber and BeautifulSoup."""
    code = (
        "from ragmesh_cli.main import build_parser\n"
        "from ragmesh_cli.ingest import load_detector\n"
        "build_parser()\n"
        "assert load_detector()('x.pdf', b'') is not None"
    )
    assert loaded_after(code) == []
