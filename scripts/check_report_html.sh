#!/usr/bin/env bash
# Renders a `nibble eval --html` report to a PNG with headless Chromium, to look at the page as a browser
# draws it (a manual check; CI does not need Chromium: `apt-get install chromium` where you run this).
#   scripts/check_report_html.sh REPORT.html [OUT.png] [WIDTHxHEIGHT]
# Chromium is offline here: --host-resolver-rules makes every host unresolvable, so a page that tried to
# load anything from the network would render visibly broken instead of silently fetching it.
set -euo pipefail
HTML=${1:?usage: $0 REPORT.html [OUT.png] [WIDTHxHEIGHT]}
OUT=${2:-${HTML%.html}.png}
SIZE=${3:-1200x2000}
[ -f "$HTML" ] || { echo "check_report_html: no such file $HTML" >&2; exit 1; }
CHROMIUM=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$CHROMIUM" ] || { echo "check_report_html: chromium not found (apt-get install chromium)" >&2; exit 1; }
if grep -Eq 'https?://|src=|href=|url\(|@import' "$HTML"; then
  echo "check_report_html: $HTML references something outside itself:" >&2
  grep -Eno 'https?://[^"<> ]*|src=[^ >]*|href=[^ >]*|url\([^)]*\)|@import' "$HTML" | head >&2
  exit 1
fi
ABS=$(cd "$(dirname "$HTML")" && pwd)/$(basename "$HTML")
OUT_ABS=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
PROFILE=$(mktemp -d)
trap 'rm -rf "$PROFILE"' EXIT
"$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$PROFILE" \
  --host-resolver-rules="MAP * ~NOTFOUND" --screenshot="$OUT_ABS" --window-size="${SIZE/x/,}" "file://$ABS" \
  >/dev/null 2>"$PROFILE/chromium.log" || { cat "$PROFILE/chromium.log" >&2; exit 1; }
[ -s "$OUT_ABS" ] || { echo "check_report_html: no screenshot written" >&2; cat "$PROFILE/chromium.log" >&2; exit 1; }
echo "$OUT_ABS"
