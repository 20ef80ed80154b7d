"""The status page: plain server-rendered HTML with one small inline script, no asset from
anywhere (it works on a machine with no internet, and in a headless browser).

The page shows the cluster's bookies (writable, read-only, unreachable, down: named in a
ledger's ensemble but not registered), the ledgers and streams of each scope with their
fragments, the under-replicated ledgers, this bookie's figures, and two charts drawn as
inline SVG: the cluster's write and read rates per second (the script polls
/api/v1/status/rates every second and turns counters into rates) and this bookie's over the
last five minutes (rendered here, refreshed from /api/v1/status/history).

The cluster's write rate is entries clients wrote: each bookie counts an add of a ledger
with write quorum Qw as 1/Qw (``written_entries``), so summing the bookies does not count
each entry once per replica. The per-bookie columns are what each bookie stores and
serves. The counters at rendering time are in the page, so the first poll already draws a
point. Every time on the page is local time as YYYY-MM-DD HH:MM:SS.
"""
from __future__ import annotations

import html
import json
import time

CHART_W, CHART_H, CHART_PAD = 560, 150, 34
COLORS = {"add": "#1f6feb", "read": "#d4731a"}


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _points(values: list, ymax: float) -> str:
    if not values:
        return ""
    if len(values) == 1:                   # one sample: a level line across the chart
        values = values * 2
    w, h = CHART_W - CHART_PAD - 6, CHART_H - 24
    step = w / (len(values) - 1)
    return " ".join(f"{CHART_PAD + i * step:.1f},{8 + h - (v / ymax) * h:.1f}" for i, v in enumerate(values))


def _time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def chart(chart_id: str, title: str, adds: list, reads: list, add_label: str = "adds/s") -> str:
    """An SVG line chart of add and read rates (the script redraws it with the same geometry)."""
    ymax = max([1.0] + adds + reads)
    h = CHART_H - 24
    grid = "".join(
        f'<line x1="{CHART_PAD}" x2="{CHART_W - 6}" y1="{8 + h * k / 4:.1f}" y2="{8 + h * k / 4:.1f}" '
        f'class="grid"/>' for k in range(5))
    return f"""<figure class="chart">
<figcaption>{_e(title)} <span class="legend"><i style="background:{COLORS['add']}"></i>{_e(add_label)}
<i style="background:{COLORS['read']}"></i>reads/s</span></figcaption>
<svg id="{chart_id}" width="{CHART_W}" height="{CHART_H}" viewBox="0 0 {CHART_W} {CHART_H}" role="img"
 aria-label="{_e(title)}">{grid}
<text class="ymax" x="2" y="14">{ymax:,.0f}</text><text x="2" y="{8 + h}">0</text>
<polyline class="add" fill="none" stroke="{COLORS['add']}" stroke-width="2" data-points="{len(adds)}"
 points="{_points(adds, ymax)}"/>
<polyline class="read" fill="none" stroke="{COLORS['read']}" stroke-width="2" data-points="{len(reads)}"
 points="{_points(reads, ymax)}"/>
</svg></figure>"""


STATE_CLASS = {"writable": "ok", "read_only": "warn", "unreachable": "bad", "down": "bad"}


def _bookies(rows: list, this_id: str) -> str:
    out = ["<table id='bookies'><tr><th>bookie</th><th>state</th><th>address</th><th>admin</th>"
           "<th>ledgers</th><th>disk free</th><th>adds/s</th><th>reads/s</th></tr>"]
    for b in rows:
        bid = b["bookie_id"]
        me = " (this one)" if bid == this_id else ""
        http = b.get("http")
        link = f'<a href="http://{_e(http)}/status">{_e(http)}</a>' if http else "-"
        free = (f"{_bytes(b.get('free_bytes'))} of {_bytes(b.get('total_bytes'))}"
                if b.get("total_bytes") else "-")
        why = f" <small>({_e(', '.join(b['read_only_reasons']))})</small>" if b.get("read_only_reasons") else ""
        out.append(
            f"<tr data-bookie='{_e(bid)}'><td class='id'>{_e(bid)}{me}</td>"
            f"<td><span class='state {STATE_CLASS.get(b['state'], '')}'>{_e(b['state'])}</span>{why}</td>"
            f"<td>{_e(b.get('address') or '-')}</td><td>{link}</td><td>{_e(b.get('ledgers', '-'))}</td>"
            f"<td>{free}</td><td class='rate add'>-</td><td class='rate read'>-</td></tr>")
    out.append("</table>")
    return "".join(out)


def _fragments(md: dict) -> str:
    return "<br>".join(f"from {f['first_entry_id']}: {_e(', '.join(f['ensemble']))}" for f in md["fragments"])


def _ledgers(ledgers: list, truncated: bool) -> str:
    plain = [md for md in ledgers if "stream_name" not in md]
    if not plain:
        return "<p class='none'>no ledgers</p>"
    by_scope: dict = {}
    for md in plain:
        by_scope.setdefault(md["ledger_scope_id"], []).append(md)
    out = []
    for scope in sorted(by_scope):
        rows = by_scope[scope]
        out.append(f"<h3>scope {scope} <small>({len(rows)} ledgers)</small></h3>"
                   "<table class='ledgers'><tr><th>qualified name</th><th>ledger id</th><th>state</th>"
                   "<th>E/Qw/Qa</th><th>last entry</th><th>length</th><th>fragments</th></tr>")
        for md in rows:
            out.append(
                f"<tr><td class='qname'>{_e(md['ledger_qualified_name'])}</td><td>{md['ledger_id']}</td>"
                f"<td>{_e(md['state'])}</td><td>{md['ensemble_size']}/{md['write_quorum']}/"
                f"{md['ack_quorum']}</td><td>{md['last_entry_id']}</td><td>{_bytes(md['length'])}</td>"
                f"<td class='frags'>{_fragments(md)}</td></tr>")
        out.append("</table>")
    if truncated:
        out.append("<p class='none'>(only the first ledgers are shown; "
                   "see /api/v1/ledger/list for all)</p>")
    return "".join(out)


def _streams(ledgers: list) -> str:
    streams = [md for md in ledgers if "stream_name" in md]
    if not streams:
        return "<p class='none'>no streams</p>"
    # streams live in one internal scope: its number says nothing to a reader, the name does
    out = ["<table class='streams'><tr><th>stream</th><th>qualified name</th><th>term</th>"
           "<th>first position</th><th>E/Qw/Qa</th><th>fragments</th></tr>"]
    for md in streams:
        out.append(f"<tr><td>{_e(md['stream_name'])}</td>"
                   f"<td class='qname'>{_e(md['ledger_qualified_name'])}</td><td>{md['term']}</td>"
                   f"<td>{md.get('first_entry_id', 0)}</td><td>{md['ensemble_size']}/{md['write_quorum']}/"
                   f"{md['ack_quorum']}</td><td class='frags'>{_fragments(md)}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _underreplicated(rows: list) -> str:
    if not rows:
        return "<p class='none' id='underreplicated'>none</p>"
    out = ["<table id='underreplicated'><tr><th>qualified name</th><th>scope</th><th>ledger id</th>"
           "<th>missing bookies</th></tr>"]
    for r in rows:
        out.append(f"<tr><td class='qname'>{_e(r['ledger_qualified_name'])}</td><td>{r['ledger_scope_id']}"
                   f"</td><td>{r['ledger_id']}</td><td>{_e(', '.join(r['missing_bookies']))}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _this(info: dict) -> str:
    d, j, m = info["disk"], info["journal"], info["memtable"]
    fsync_ms = 1000 * j.get("fsync_time_s", 0) / j["fsyncs"] if j.get("fsyncs") else 0.0
    rows = [
        ("state", info["state"]), ("address", info["address"]), ("directory", info["directory"]),
        ("disk", f"{_bytes(d['used_bytes'])} used of {_bytes(d['total_bytes'])} "
                 f"({100 * d['usage_ratio']:.1f}%)"),
        ("journal", f"{_bytes(d['journal_bytes'])} in {d['journal_files']} files; {j.get('groups', 0):,} "
                    f"groups, {j.get('fsyncs', 0):,} fsyncs, mean fsync {fsync_ms:.2f} ms"),
        ("group commit triggers", ", ".join(f"{t} {j.get(t, 0):,}"
                                            for t in ("queue_empty", "time", "bytes", "entries"))),
        ("entry logs", f"{info['entry_logs']['count']} logs, {_bytes(info['entry_logs']['bytes'])}"),
        ("memtable", f"{_bytes(m['bytes'])} in {m['entries']:,} entries (limit {_bytes(m['limit_bytes'])})"),
        ("compaction", f"{100 * info['compaction']['progress']:.0f}%"),
        ("adds / reads", f"{info['add_entries']:,} / {info['read_entries']:,} entries"),
    ]
    return "<table id='this'>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


STYLE = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px;color:#1b1f24;background:#fafbfc}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #d0d7de}
h3{font-size:14px;margin:12px 0 4px} small,.meta{color:#57606a}
table{border-collapse:collapse;background:#fff;margin:4px 0} th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600} td.qname,td.id{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
td.frags{font-size:12px} td.rate{text-align:right;font-variant-numeric:tabular-nums}
.state{padding:1px 6px;border-radius:8px;font-size:12px} .ok{background:#dafbe1} .warn{background:#fff8c5} .bad{background:#ffebe9}
.charts{display:flex;flex-wrap:wrap;gap:16px} figure.chart{margin:0;background:#fff;border:1px solid #d0d7de;padding:6px}
figcaption{font-weight:600;margin-bottom:4px} .legend{font-weight:400;font-size:12px;margin-left:8px}
.legend i{display:inline-block;width:10px;height:10px;margin:0 3px 0 8px}
svg .grid{stroke:#eaeef2} svg text{font-size:10px;fill:#57606a} .none{color:#57606a}
"""

SCRIPT = """
(function(){
  var W=%(w)d,H=%(h)d,PAD=%(pad)d,KEEP=120;
  function pts(vals,ymax){ if(!vals.length) return ""; if(vals.length<2) vals=[vals[0],vals[0]];
    var w=W-PAD-6,h=H-24,step=w/(vals.length-1),out=[];
    for(var i=0;i<vals.length;i++){out.push((PAD+i*step).toFixed(1)+","+(8+h-(vals[i]/ymax)*h).toFixed(1));}
    return out.join(" "); }
  function draw(id,adds,reads){ var svg=document.getElementById(id); if(!svg) return;
    var ymax=Math.max.apply(null,[1].concat(adds,reads));
    svg.querySelector("text.ymax").textContent=Math.round(ymax).toLocaleString();
    var a=svg.querySelector("polyline.add"),r=svg.querySelector("polyline.read");
    a.setAttribute("points",pts(adds,ymax)); a.setAttribute("data-points",adds.length);
    r.setAttribute("points",pts(reads,ymax)); r.setAttribute("data-points",reads.length); }
  function two(n){ return (n<10?"0":"")+n; }
  function stamp(t){ var d=new Date(t*1000);
    return d.getFullYear()+"-"+two(d.getMonth()+1)+"-"+two(d.getDate())+" "+two(d.getHours())+":"+
      two(d.getMinutes())+":"+two(d.getSeconds()); }
  // the counters when the page was rendered: the first poll already makes a point
  var prev=%(seed)s,cAdds=[],cReads=[];
  function cell(id,cls,text){ var row=document.querySelector("tr[data-bookie='"+id+"']");
    if(row){ var c=row.querySelector("td.rate."+cls); if(c) c.textContent=text; } }
  function poll(){
    fetch("/api/v1/status/rates",{cache:"no-store"}).then(function(r){return r.json();}).then(function(d){
      var now=d.time,sa=0,sr=0,any=false;
      d.bookies.forEach(function(b){
        if(prev && prev.counts[b.bookie_id] && b.add_entries!=null){
          var p=prev.counts[b.bookie_id],dt=now-prev.time; if(dt<=0) return;
          var ra=Math.max(0,b.add_entries-p[0])/dt,rr=Math.max(0,b.read_entries-p[1])/dt;
          // the cluster writes what clients wrote (1/Qw per replica), not every replica
          var rw=(b.written_entries!=null&&p[2]!=null)?Math.max(0,b.written_entries-p[2])/dt:ra;
          sa+=rw; sr+=rr; any=true;
          cell(b.bookie_id,"add",ra.toFixed(1)); cell(b.bookie_id,"read",rr.toFixed(1)); }
      });
      var counts={}; d.bookies.forEach(function(b){ if(b.add_entries!=null)
        counts[b.bookie_id]=[b.add_entries,b.read_entries,b.written_entries]; });
      if(prev){ cAdds.push(any?sa:0); cReads.push(any?sr:0);
        if(cAdds.length>KEEP){cAdds.shift();cReads.shift();} draw("cluster-rates",cAdds,cReads); }
      prev={time:now,counts:counts};
      document.getElementById("updated").textContent=stamp(now);
    }).catch(function(e){ document.getElementById("updated").textContent="update failed: "+e; });
  }
  function history(){
    fetch("/api/v1/status/history",{cache:"no-store"}).then(function(r){return r.json();}).then(function(d){
      draw("bookie-rates",d.points.map(function(p){return p.add_per_s;}),d.points.map(function(p){return p.read_per_s;}));
    }).catch(function(){});
  }
  poll(); setInterval(poll,1000); setInterval(history,5000);
})();
"""


def render(snap: dict) -> str:
    info = snap["this"]
    hist = snap["history"]
    counts = {}
    for b in snap["bookies"]:
        counts[b["state"]] = counts.get(b["state"], 0) + 1
    summary = ", ".join(f"{n} {s.replace('_', '-')}" for s, n in sorted(counts.items()))
    seed = {"time": snap["time"], "counts": {
        b["bookie_id"]: [b["add_entries"], b.get("read_entries"), b.get("written_entries")]
        for b in snap["bookies"] if b.get("add_entries") is not None}}
    # inside <script>: "</" must not end it early (bookie ids are the operator's strings)
    seed_js = json.dumps(seed).replace("</", "<\\/")
    script = SCRIPT % {"w": CHART_W, "h": CHART_H, "pad": CHART_PAD, "seed": seed_js}
    generated = _time(snap["time"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>embedlog status: {_e(info['bookie_id'])}</title>
<style>{STYLE}</style></head>
<body>
<h1>embedlog status</h1>
<p class="meta">bookie <b>{_e(info['bookie_id'])}</b> ({_e(info['state'])}) · metadata {_e(snap['metadata_uri'])}
 · rendered {generated} · live figures updated <span id="updated">-</span></p>
<h2>Bookies <small>{_e(summary)}</small></h2>
{_bookies(snap['bookies'], info['bookie_id'])}
<h2>Add and read rates</h2>
<div class="charts">
{chart("cluster-rates", "cluster, entries per second (live)", [], [], "written/s")}
{chart("bookie-rates", "this bookie, last 5 minutes", [p['add_per_s'] for p in hist], [p['read_per_s'] for p in hist])}
</div>
<h2>Under-replicated ledgers</h2>
{_underreplicated(snap['underreplicated'])}
<h2>Ledgers</h2>
{_ledgers(snap['ledgers'], snap['ledgers_truncated'])}
<h2>Streams</h2>
{_streams(snap['ledgers'])}
<h2>This bookie</h2>
{_this(info)}
<p class="meta">JSON: <a href="/api/v1/bookie/info">bookie info</a> · <a href="/api/v1/ledger/list?print_metadata=true">ledgers</a>
 · <a href="/api/v1/autorecovery/status">autorecovery</a> · <a href="/metrics">metrics</a></p>
<script>{script}</script>
</body></html>
"""
