//! `gpufrag report` as a user opens it (issue 7): the HTML file rendered by headless Chromium
//! (Debian's `chromium`), its DOM read after the scripts ran, and the numbers checked where the
//! page shows them: the memory map, the timeline and the verdict for the H200 traces.

mod tool_support;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpufrag-views-report-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn gpufrag(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag")).args(args).output().expect("run gpufrag");
    assert!(out.status.success(), "gpufrag {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn chromium() -> Option<PathBuf> {
    for c in ["chromium", "chromium-browser"] {
        if let Ok(o) = Command::new("sh").arg("-c").arg(format!("command -v {c}")).output() {
            if o.status.success() {
                return Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
            }
        }
    }
    None
}

/// Runs headless Chromium on `page` with `extra` flags; returns stdout.
fn browse(page: &Path, extra: &[&str]) -> Option<String> {
    let Some(bin) = chromium() else {
        tool_support::missing("chromium", "apt-get install chromium");
        return None;
    };
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let profile = tmp(&format!("profile{}", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The attributes of the first start tag that contains `marker` (e.g. `id="verdict"`).
fn attrs(dom: &str, marker: &str) -> HashMap<String, String> {
    let at = dom.find(marker).unwrap_or_else(|| panic!("no element with {marker} in the DOM"));
    let start = dom[..at].rfind('<').expect("tag start");
    let end = at + dom[at..].find('>').expect("tag end");
    let tag = &dom[start..end];
    let mut out = HashMap::new();
    let mut rest = tag;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].rsplit(|c: char| c.is_whitespace()).next().unwrap_or("").to_string();
        let after = &rest[eq + 2..];
        let close = after.find('"').expect("closing quote");
        out.insert(name, after[..close].to_string());
        rest = &after[close + 1..];
    }
    out
}

fn report(input: &Path, dir: &Path, name: &str) -> (PathBuf, f64) {
    let html = dir.join(format!("{name}.html"));
    let t = Instant::now();
    gpufrag(&["report", input.to_str().expect("utf-8"), "-o", html.to_str().expect("utf-8")]);
    (html, t.elapsed().as_secs_f64())
}

#[test]
fn frag_oom_report_shows_the_map_the_timeline_and_the_verdict() {
    let dir = tmp("frag");
    let (html, _) = report(&fixture("frag_oom.pickle"), &dir, "frag_oom");
    let text = std::fs::read_to_string(&html).expect("report written");
    assert!(
        !text.contains("http://") || text.matches("http://").all(|_| text.contains("xmlns=\"http://www.w3.org/2000/svg\"")),
        "no network at view time"
    );
    assert!(!text.contains("https://") && !text.contains("src=\""), "the report is self-contained");
    assert!(
        text.contains("Caching allocator: pid 0: PyTorch&#39;s caching allocator")
            || text.contains("Caching allocator: pid 0: PyTorch's caching allocator"),
        "the report names the process's allocator"
    );
    let Some(dom) = browse(&html, &["--dump-dom"]) else { return };

    let body = attrs(&dom, "data-schema=");
    assert_eq!(body.get("data-ready").map(String::as_str), Some("1"), "the page's script ran");

    let v = attrs(&dom, "id=\"verdict\"");
    assert_eq!(v["data-verdict"], "fragmentation");
    assert_eq!(v["data-requested"], "2684354560");
    assert_eq!(v["data-largest-free-block"], "209715200");
    assert_eq!(v["data-stranded"], "2097152000");
    assert_eq!(v["data-device-free"], "2398224384");
    assert!(dom.contains("expandable_segments:True"), "the fix is named");

    let m = attrs(&dom, "id=\"memory-map\"");
    assert_eq!(m["data-segments"], "20");
    assert_eq!(m["data-requested"], "2684354560");
    assert_eq!(m["data-largest-free-block"], "209715200");
    assert_eq!(m["data-stranded"], "2097152000");
    assert_eq!(dom.matches("class=\"segment\"").count(), 20, "20 segments drawn");
    assert_eq!(attrs(&dom, "id=\"bar-request\"")["data-bytes"], "2684354560");
    assert_eq!(attrs(&dom, "id=\"bar-largest-free\"")["data-bytes"], "209715200");
    assert_eq!(attrs(&dom, "id=\"largest-free-run\"")["data-bytes"], "209715200");
    let stranded = attrs(&dom, "id=\"bar-stranded\"");
    assert_eq!((stranded["data-bytes"].as_str(), stranded["data-pieces"].as_str()), ("2097152000", "10"));

    let t = attrs(&dom, "id=\"timeline-dev0\"");
    assert_eq!(t["data-ooms"], "1");
    assert!(t["data-points"].parse::<usize>().expect("points") >= 10);
    assert_eq!(t["data-peak-reserved"], "10485760000");
    assert!(dom.contains("class=\"oom-mark\" data-requested=\"2684354560\""));

    let row = attrs(&dom, "data-field=\"stranded\" data-bytes=");
    assert_eq!(row["data-bytes"], "2097152000", "the devices table");
    assert!(dom.contains("id=\"stranded-table\"") && dom.contains("id=\"ooms-table\""));
    assert_eq!(dom.matches("<tr data-address=").count(), 10, "ten segments strand memory");

    // A screenshot renders (the picture in docs/ is made the same way).
    let png = dir.join("frag_oom.png");
    browse(&html, &[&format!("--screenshot={}", png.display()), "--window-size=1280,1800", "--hide-scrollbars"]);
    let bytes = std::fs::read(&png).expect("screenshot");
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000, "a real picture");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpt2_report_stays_fast_and_light_with_204_segments() {
    let dir = tmp("gpt2");
    let (html, secs) = report(&fixture("gpt2_varlen.pickle.gz"), &dir, "gpt2");
    let size = std::fs::metadata(&html).expect("written").len();
    eprintln!("gpt2_varlen report: {secs:.3} s, {size} bytes");
    assert!(size < 1_000_000, "light to open: {size} bytes");
    let text = std::fs::read_to_string(&html).expect("read");
    assert!(text.matches("<rect").count() < 5_000, "SVG elements capped");
    assert!(secs < 10.0, "fast to render: {secs} s");
    let Some(dom) = browse(&html, &["--dump-dom"]) else { return };
    assert_eq!(attrs(&dom, "id=\"verdict\"")["data-verdict"], "none");
    let m = attrs(&dom, "id=\"memory-map\"");
    assert_eq!(m["data-segments"], "204");
    assert_eq!(m["data-layout"], "packed");
    assert_eq!(m["data-largest-free-block"], "2703228928");
    assert_eq!(m["data-stranded"], "384847360");
    assert_eq!(dom.matches("class=\"segment\"").count(), 204);
    let t = attrs(&dom, "id=\"timeline-dev0\"");
    let points: usize = t["data-points"].parse().expect("points");
    assert!((100..=1200).contains(&points), "38,927 entries downsampled to {points} points");
    assert_eq!(t["data-peak-reserved"], "26505904128");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_summary_json_gives_the_verdict_and_the_bars_without_a_map() {
    let dir = tmp("summary");
    let out = gpufrag(&["analyze", "--json", fixture("frag_oom.pickle").to_str().expect("utf-8")]);
    let json = dir.join("summary.json");
    std::fs::write(&json, &out.stdout).expect("write");
    let (html, _) = report(&json, &dir, "from-summary");
    let text = std::fs::read_to_string(&html).expect("read");
    let v = attrs(&text, "id=\"verdict\"");
    assert_eq!((v["data-verdict"].as_str(), v["data-requested"].as_str()), ("fragmentation", "2684354560"));
    assert_eq!(attrs(&text, "id=\"memory-map\"")["data-segments"], "0");
    assert_eq!(attrs(&text, "id=\"bar-request\"")["data-bytes"], "2684354560");
    assert!(text.contains("id=\"timeline-empty\""));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn svg_flag_writes_the_map_alone() {
    let dir = tmp("svg");
    let svg = dir.join("map.svg");
    gpufrag(&["report", fixture("frag_oom.pickle").to_str().expect("utf-8"), "--svg", svg.to_str().expect("utf-8")]);
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(text.starts_with("<?xml"));
    assert_eq!(attrs(&text, "id=\"memory-map\"")["data-segments"], "20");
    assert!(!dir.join("report.html").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_oom_number_is_unusable_input() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpufrag"))
        .args(["report", fixture("frag_oom.pickle").to_str().expect("utf-8"), "--oom", "5", "-o", "/dev/null"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 27: one headline (the sentence under it does not say the verdict again), the fix's
/// setting as code to copy, and the card of free in all against the largest free piece, read in
/// headless Chromium: frag_oom.pickle's 4.19 GiB free in all (device free + stranded) against
/// 2.23 GiB in one piece (device free less the driver's 4 MiB slack).
#[test]
fn frag_oom_report_has_one_headline_the_fix_as_code_and_the_free_against_largest_card() {
    let dir = tmp("card");
    let (html, _) = report(&fixture("frag_oom.pickle"), &dir, "card");
    let Some(dom) = browse(&html, &["--dump-dom"]) else { return };
    let card = attrs(&dom, "id=\"card-free-vs-largest\"");
    assert_eq!(card["data-free-in-all"], (2_398_224_384u64 + 2_097_152_000).to_string(), "{card:?}");
    assert_eq!(card["data-largest-piece"], (2_398_224_384u64 - (4 << 20)).to_string(), "{card:?}");
    assert_eq!(card["data-requested"], "2684354560");
    assert!(dom.contains("<code id=\"fix-command\">export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True</code>"), "the fix as code");
    assert!(dom.contains("id=\"copy-fix\""), "a copy button");
    let verdict = &dom[dom.find("id=\"verdict\"").expect("verdict")..];
    let why = &verdict[verdict.find("<p class=\"why\">").expect("why") + 15..];
    assert!(!why.to_lowercase().starts_with("fragmentation"), "the headline said it already: {}", &why[..80.min(why.len())]);
    assert_eq!(verdict.matches("<h2>").count().min(1), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 28 item 2, one sentence per verdict: the report's headline is the wording of
/// `views::point::headline`, the one the demo's last lines and `gpufrag analyze` users read
/// (the report kept its own beside it), with the summary's own verdict and request.
#[test]
fn the_reports_headline_is_the_one_sentence_of_its_verdict() {
    let dir = tmp("one-sentence");
    let (html, _) = report(&fixture("frag_oom.pickle"), &dir, "one");
    let text = std::fs::read_to_string(&html).expect("report written");
    let out = gpufrag(&["analyze", "--json", fixture("frag_oom.pickle").to_str().expect("utf-8")]);
    let s: gpufrag::analysis::summary::Summary = serde_json::from_slice(&out.stdout).expect("summary json");
    let want = gpufrag::views::point::headline(&s.ooms[0]);
    assert_eq!(want, "Fragmentation OOM: 2.50 GiB requested");
    let verdict = &text[text.find("id=\"verdict\"").expect("verdict section")..];
    let h2 = &verdict[verdict.find("<h2>").expect("a headline") + 4..];
    assert_eq!(&h2[..h2.find("</h2>").expect("its end")], want, "the report's headline against point::headline");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 27: three OOMs 10 ms apart had their labels drawn over each other on the timeline. Laid
/// out in Chromium, no two labels' boxes intersect (the page's own layout, measured by a script
/// added to a copy of it).
#[test]
fn three_ooms_close_together_get_labels_that_do_not_overlap() {
    use gpufrag::event::{Event, EventKind, F_DEVICE_FREE_KNOWN};
    let dir = tmp("labels");
    let rec = dir.join("three.rec");
    let mut w = gpufrag::record::Writer::create(&rec).expect("record");
    let s = 1_000_000_000u64;
    let free = |e: Event| Event { device_free: 1 << 30, flags: F_DEVICE_FREE_KNOWN, ..e };
    w.write(&free(Event { ts_ns: s, addr: 1 << 40, size: 4 << 30, requested: 4 << 30, ..Event::new(EventKind::MemAlloc, 100, 0) }))
        .expect("write");
    for (i, pid) in [100u32, 101, 102].into_iter().enumerate() {
        let e = Event {
            ts_ns: 20 * s + i as u64 * 10_000_000,
            requested: 8 << 30,
            rc: 2,
            op: EventKind::MemAlloc as u16,
            ..Event::new(EventKind::AllocFailed, pid, 0)
        };
        w.write(&free(e)).expect("write");
    }
    // Each process exits after its failure: the one OOM rule decides each an OOM (not a retry).
    for pid in [100u32, 101, 102] {
        w.write(&Event { ts_ns: 21 * s, ..Event::new(EventKind::ProcessExit, pid, -1) }).expect("write");
    }
    w.finish().expect("finish");
    let (html, _) = report(&rec, &dir, "labels");
    let page = std::fs::read_to_string(&html).expect("report");
    let probe = "<script>addEventListener('load',()=>{const b=[...document.querySelectorAll('.oom-mark text')].map(t=>t.getBoundingClientRect());\
let o=0;for(let i=0;i<b.length;i++)for(let j=i+1;j<b.length;j++){const p=b[i],q=b[j];if(p.left<q.right&&q.left<p.right&&p.top<q.bottom&&q.top<p.bottom)o++;}\
document.body.setAttribute('data-labels',b.length);document.body.setAttribute('data-overlaps',o);});</script>";
    let probed = dir.join("probed.html");
    std::fs::write(&probed, page.replace("</body>", &format!("{probe}</body>"))).expect("write");
    let Some(dom) = browse(&probed, &["--dump-dom", "--window-size=1280,800"]) else { return };
    let body = attrs(&dom, "data-overlaps=");
    assert_eq!(body["data-labels"], "3", "three OOM labels");
    assert_eq!(body["data-overlaps"], "0", "labels overlap");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 27: 95 % of the demo's time axis was empty: a device-free reading at `cuInit`, then the
/// program's own start-up, then every allocation and the OOM in the last 5 %. A trace read at 1 s
/// whose first allocation is at 10 s and whose OOM is at 10.5 s: the axis starts at the first
/// allocation (the reserved line rises at the axis's left end, the OOM at the middle), and says so.
#[test]
fn the_time_axis_starts_at_the_first_allocation_and_says_so() {
    use gpufrag::event::{Event, EventKind, F_DEVICE_FREE_KNOWN};
    let dir = tmp("axis");
    let rec = dir.join("startup.rec");
    let mut w = gpufrag::record::Writer::create(&rec).expect("record");
    let s = 1_000_000_000u64;
    let gib = 1u64 << 30;
    let free = |e: Event, f: u64| Event { device_free: f, flags: F_DEVICE_FREE_KNOWN, ..e };
    w.write(&free(Event { ts_ns: s, size: 16 * gib, ..Event::new(EventKind::DeviceInfo, 100, 0) }, 15 * gib)).expect("write");
    w.write(&free(
        Event { ts_ns: 10 * s, addr: 1 << 40, size: 12 * gib, requested: 12 * gib, ..Event::new(EventKind::MemAlloc, 100, 0) },
        3 * gib,
    ))
    .expect("write");
    let oom = Event {
        ts_ns: 10 * s + s / 2,
        requested: 8 * gib,
        rc: 2,
        op: EventKind::MemAlloc as u16,
        ..Event::new(EventKind::AllocFailed, 100, 0)
    };
    w.write(&free(oom, 3 * gib)).expect("write");
    w.write(&Event { ts_ns: 11 * s, ..Event::new(EventKind::ProcessExit, 100, -1) }).expect("write");
    w.finish().expect("finish");
    let (html, _) = report(&rec, &dir, "axis");
    let page = std::fs::read_to_string(&html).expect("report");
    let svg = &page[page.find("id=\"timeline-dev0\"").expect("timeline")..];
    let svg = &svg[..svg.find("</svg>").expect("end")];
    // The picture's x range (src/views/timeline.rs): 90 to 1170.
    let (x0, x1) = (90.0f64, 1170.0f64);
    // The reserved line: its first rise (a `V` to above the axis) is at the first allocation.
    let d = attrs(svg, "id=\"series-reserved-dev0\"")["d"].clone();
    let rise = d.find('V').expect("reserved rises");
    let x_rise: f64 = d[..rise].rsplit(['H', 'M', ' ']).find(|t| !t.is_empty()).and_then(|t| t.parse().ok()).expect("x of the rise");
    // Independently: the axis runs from the first allocation (10 s) to the last event (11 s).
    let at = |t: f64| x0 + (t - 10.0) / (11.0 - 10.0) * (x1 - x0);
    assert!((x_rise - at(10.0)).abs() < 1.0, "the first allocation at x {x_rise}, want {}: {d}", at(10.0));
    let oom_x: f64 = svg
        .split("<g class=\"oom-mark\"")
        .nth(1)
        .and_then(|g| g.split("x1=\"").nth(1))
        .and_then(|v| v.split('"').next())
        .and_then(|v| v.parse().ok())
        .expect("OOM mark");
    assert!((oom_x - at(10.5)).abs() < 1.0, "the OOM at x {oom_x}, want {}", at(10.5));
    let axis = attrs(svg, "class=\"axis-start\"");
    assert_eq!(axis["data-t0-ns"], (10 * s).to_string());
    assert_eq!(axis["data-lead-ns"], (9 * s).to_string());
    // (the apostrophe as the SVG escapes it)
    assert!(svg.contains("time since the first allocation (9.0 s after the trace&#39;s first event)"), "{svg}");
    let _ = std::fs::remove_dir_all(&dir);
}
