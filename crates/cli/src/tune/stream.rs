//! Reading logs as a stream: plain or gzip files, one line at a time into a reused buffer,
//! parsed, keyed, costed, put back in time order within a small window, and handed to the
//! replay in chunks of bounded size.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use flate2::read::MultiGzDecoder;

use super::classes::Classes;
use super::format::LineParser;
use super::time::Stamp;

const NANOS: u64 = 1_000_000_000;

/// The longest line read; a longer one is a bad line (and is not held in memory).
pub(crate) const MAX_LINE: usize = 1 << 20;

/// How many bad lines the report shows.
pub(crate) const SHOWN_BAD_LINES: usize = 5;

/// One request, ready for the replay: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    /// Nanoseconds since the replay's origin (the manual clock's reading).
    pub(crate) at: u64,
    /// The key's index in [`Keys`].
    pub(crate) key: u32,
    /// Tokens.
    pub(crate) cost: u32,
}

/// How requests logged with whole-second timestamps are placed inside their second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Spread {
    /// The second's n requests at 0, 1/n, 2/n, ... of it, in log order.
    Even,
    /// Each at a uniformly random point of the second (seeded by --seed and the second,
    /// so the same log and seed give the same replay).
    Random,
    /// All at the start of the second: the harshest reading, a burst each second.
    Start,
}

/// Keys seen, interned to dense indices, with the requests and tokens of each.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    index: HashMap<Box<str>, u32>,
    pub(crate) names: Vec<Box<str>>,
    pub(crate) requests: Vec<u64>,
    pub(crate) tokens: Vec<u64>,
}

impl Keys {
    fn intern(&mut self, key: &str) -> Result<u32, String> {
        if let Some(&i) = self.index.get(key) {
            return Ok(i);
        }
        let i = u32::try_from(self.names.len())
            .map_err(|_| format!("more than {} distinct keys", u32::MAX))?;
        self.index.insert(key.into(), i);
        self.names.push(key.into());
        self.requests.push(0);
        self.tokens.push(0);
        Ok(i)
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

/// Puts events back in time order: a line may be up to `window` seconds earlier than the
/// latest line before it. Seconds older than that are complete: they are spread and
/// released in order.
#[derive(Debug)]
pub(crate) struct Orderer {
    window: u64,
    spread: Spread,
    seed: u64,
    pending: BTreeMap<u64, Vec<Pending>>,
    latest: Option<u64>,
    origin_nanos: u64,
    pub(crate) out: Vec<Event>,
    /// Lines accepted with a time earlier than a line before them, put back in order.
    pub(crate) reordered: u64,
    /// The most seconds such a line was earlier than the latest line before it.
    pub(crate) most_late: u64,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    /// Nanoseconds into the second, or `None` for a whole-second timestamp.
    into: Option<u32>,
    key: u32,
    cost: u32,
}

impl Orderer {
    /// `window` in whole seconds.
    pub(crate) fn new(window: u64, spread: Spread, seed: u64) -> Orderer {
        Orderer {
            window,
            spread,
            seed,
            pending: BTreeMap::new(),
            latest: None,
            origin_nanos: 0,
            out: Vec::new(),
            reordered: 0,
            most_late: 0,
        }
    }

    /// The wall-clock time (nanoseconds since the Unix epoch) the replay's clock reads 0
    /// at: the first line's second less the window, so no accepted line is before it.
    pub(crate) fn origin_nanos(&self) -> u64 {
        self.origin_nanos
    }

    /// Why a line with this time cannot be accepted, if it cannot: it is earlier than the
    /// window allows.
    pub(crate) fn refuse(&self, stamp: Stamp) -> Option<String> {
        let second = stamp.nanos / NANOS;
        let latest = self.latest?;
        (second + self.window < latest).then(|| {
            format!(
                "{} s earlier than a line before it, beyond the reorder window of {} s \
                 (--reorder-window)",
                latest - second,
                self.window
            )
        })
    }

    /// Takes one request (call [`refuse`](Orderer::refuse) first); releases the seconds
    /// it completes into `out`.
    pub(crate) fn push(&mut self, stamp: Stamp, key: u32, cost: u32) {
        let second = stamp.nanos / NANOS;
        if self.latest.is_none() {
            self.origin_nanos = second.saturating_sub(self.window) * NANOS;
        }
        if let Some(latest) = self.latest.filter(|&l| stamp.nanos < l * NANOS) {
            self.reordered += 1;
            self.most_late = self.most_late.max(latest - second);
        }
        let into = (!stamp.whole_second).then_some((stamp.nanos % NANOS) as u32);
        self.pending
            .entry(second)
            .or_default()
            .push(Pending { into, key, cost });
        if self.latest.is_none_or(|l| second > l) {
            self.latest = Some(second);
            let complete = second.saturating_sub(self.window);
            while let Some(entry) = self.pending.first_entry() {
                if *entry.key() >= complete {
                    break;
                }
                let (s, requests) = entry.remove_entry();
                self.release(s, &requests);
            }
        }
    }

    /// Releases every pending second (the end of the log).
    pub(crate) fn finish(&mut self) {
        while let Some((s, requests)) = self.pending.pop_first() {
            self.release(s, &requests);
        }
    }

    fn release(&mut self, second: u64, requests: &[Pending]) {
        let whole = requests.iter().filter(|p| p.into.is_none()).count() as u64;
        let start = self.out.len();
        let base = second * NANOS - self.origin_nanos;
        let mut i = 0;
        for p in requests {
            let into = match p.into {
                Some(n) => u64::from(n),
                None => {
                    let at = match self.spread {
                        Spread::Even => i * NANOS / whole,
                        Spread::Random => splitmix(self.seed ^ splitmix(second) ^ i) % NANOS,
                        Spread::Start => 0,
                    };
                    i += 1;
                    at
                }
            };
            self.out.push(Event {
                at: base + into,
                key: p.key,
                cost: p.cost,
            });
        }
        // Stable: requests at the same instant keep their log order.
        self.out[start..].sort_by_key(|e| e.at);
    }
}

/// SplitMix64's output function: a well-mixed 64-bit hash of `x`.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What reading the logs found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Lines read, blank ones included.
    pub(crate) lines: u64,
    /// Lines that were not requests: bad, too long, not UTF-8, or too late.
    pub(crate) bad: u64,
    /// The first few bad lines: `file:line: why`.
    pub(crate) bad_shown: Vec<String>,
    /// Requests accepted.
    pub(crate) requests: u64,
    /// Tokens they cost.
    pub(crate) tokens: u64,
    /// Earliest and latest request time, nanoseconds since the Unix epoch.
    pub(crate) span: Option<(u64, u64)>,
    /// Bad lines that were out of order beyond the reorder window.
    pub(crate) late: u64,
}

impl Scan {
    fn bad_line(&mut self, file: &str, line: u64, why: &str) {
        self.bad += 1;
        if self.bad_shown.len() < SHOWN_BAD_LINES {
            self.bad_shown.push(format!("{file}:{line}: {why}"));
        }
    }
}

/// How the lines become requests: the logs, read one after the other, and what was
/// learned from them so far.
pub(crate) struct Reading<'p> {
    pub(crate) parser: &'p LineParser,
    pub(crate) classes: Classes,
    pub(crate) keys: Keys,
    pub(crate) orderer: Orderer,
    pub(crate) scan: Scan,
    /// Events per chunk handed to the replay.
    pub(crate) chunk: usize,
    paths: Vec<PathBuf>,
    /// The log being read and its last line number.
    reader: Option<Box<dyn BufRead + Send>>,
    name: String,
    number: u64,
    next_path: usize,
    finished: bool,
    buf: Vec<u8>,
    /// Bytes of the files (as stored, compressed or not) read so far: those finished,
    /// and the one being read (counted as its reader takes them).
    done_bytes: u64,
    current_bytes: Arc<AtomicU64>,
    /// The files' total size, when every log is a file whose size is known.
    total_bytes: Option<u64>,
    /// Progress lines on standard error, at most one a second.
    progress: Option<Instant>,
}

impl std::fmt::Debug for Reading<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reading")
            .field("paths", &self.paths)
            .field("scan", &self.scan)
            .finish_non_exhaustive()
    }
}

impl<'p> Reading<'p> {
    pub(crate) fn new(
        parser: &'p LineParser,
        classes: Classes,
        orderer: Orderer,
        chunk: usize,
        paths: Vec<PathBuf>,
        progress: bool,
    ) -> Reading<'p> {
        let total_bytes = paths
            .iter()
            .map(|p| {
                (p.as_os_str() != "-")
                    .then(|| std::fs::metadata(p).ok().map(|m| m.len()))
                    .flatten()
            })
            .sum();
        Reading {
            parser,
            classes,
            keys: Keys::default(),
            orderer,
            scan: Scan::default(),
            chunk,
            paths,
            reader: None,
            name: String::new(),
            number: 0,
            next_path: 0,
            finished: false,
            buf: Vec::with_capacity(4096),
            done_bytes: 0,
            current_bytes: Arc::new(AtomicU64::new(0)),
            total_bytes,
            progress: progress.then(Instant::now),
        }
    }

    /// How much of the logs has been read: a percentage of their bytes when their size
    /// is known, else the lines.
    pub(crate) fn progress(&self) -> String {
        let read = self.done_bytes + self.current_bytes.load(Ordering::Relaxed);
        match self.total_bytes {
            Some(total) if total > 0 => format!(
                "{}% of the logs read ({} of {} bytes), {} lines",
                (read.min(total) * 100 / total),
                read.min(total),
                total,
                self.scan.lines
            ),
            _ => format!("{} lines read", self.scan.lines),
        }
    }

    /// The next chunk of time-ordered events: at least `chunk` of them (plus the rest of
    /// a second) unless the logs end first; empty once they have.
    ///
    /// # Errors
    ///
    /// A file that cannot be opened or read, or more than `u32::MAX` keys; and, to save
    /// a long run on the wrong `--format`, a log whose first 1000 lines are all bad.
    pub(crate) fn next_chunk(&mut self) -> Result<Vec<Event>, String> {
        while !self.finished && self.orderer.out.len() < self.chunk {
            let Some(reader) = self.reader.as_mut() else {
                self.done_bytes += self.current_bytes.swap(0, Ordering::Relaxed);
                let Some(path) = self.paths.get(self.next_path) else {
                    self.orderer.finish();
                    self.finished = true;
                    break;
                };
                self.reader = Some(open(path, Arc::clone(&self.current_bytes))?);
                self.name = path.display().to_string();
                self.number = 0;
                self.next_path += 1;
                continue;
            };
            let long = match read_line(reader.as_mut(), &mut self.buf, MAX_LINE) {
                Ok(None) => {
                    self.reader = None;
                    continue;
                }
                Ok(Some(long)) => long,
                Err(e) => return Err(format!("cannot read {}: {e}", self.name)),
            };
            self.number += 1;
            self.scan.lines += 1;
            let bad = if long {
                Some(format!("longer than {MAX_LINE} bytes"))
            } else {
                let buf = std::mem::take(&mut self.buf);
                let bad = self.line(&buf);
                self.buf = buf;
                bad?
            };
            if let Some(why) = bad {
                self.scan.bad_line(&self.name, self.number, &why);
            }
            if self.scan.lines.is_multiple_of(4096)
                && let Some(last) = self.progress
                && last.elapsed() >= Duration::from_secs(1)
            {
                eprintln!("tune: {}", self.progress());
                self.progress = Some(Instant::now());
            }
            if self.scan.lines == 1000 && self.scan.requests == 0 && self.scan.bad > 0 {
                return Err(format!(
                    "none of the first 1000 lines is a request in the {} format; first: {}",
                    format!("{:?}", self.parser.format()).to_lowercase(),
                    self.scan.bad_shown.join("; ")
                ));
            }
        }
        Ok(std::mem::take(&mut self.orderer.out))
    }

    /// Takes one line: `Ok(Some(why))` when it is a bad line.
    fn line(&mut self, bytes: &[u8]) -> Result<Option<String>, String> {
        let Ok(line) = std::str::from_utf8(bytes) else {
            return Ok(Some("not UTF-8".into()));
        };
        if line.trim().is_empty() || (self.scan.requests == 0 && self.parser.is_header(line)) {
            return Ok(None);
        }
        let record = match self.parser.parse(line) {
            Ok(r) => r,
            Err(why) => return Ok(Some(why)),
        };
        if let Some(why) = self.orderer.refuse(record.stamp) {
            self.scan.late += 1;
            return Ok(Some(why));
        }
        let cost = match record.cost {
            Some(c) => c,
            None => self.classes.cost(&record.method, &record.path),
        };
        let key = self.keys.intern(&record.key)?;
        let k = key as usize;
        self.keys.requests[k] += 1;
        self.keys.tokens[k] += cost;
        self.scan.requests += 1;
        self.scan.tokens += cost;
        let t = record.stamp.nanos;
        self.scan.span = Some(self.scan.span.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        // Costs are at most MAX_COST = u32::MAX (the parsers and classes check).
        self.orderer
            .push(record.stamp, key, u32::try_from(cost).unwrap_or(u32::MAX));
        Ok(None)
    }
}

/// A reader that counts the bytes it hands out.
struct Counted<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Opens a log: `-` is standard input; gzip is recognized by its magic bytes. The bytes
/// read from the file (compressed, if it is) are added to `count`.
fn open(path: &Path, count: Arc<AtomicU64>) -> Result<Box<dyn BufRead + Send>, String> {
    let raw: Box<dyn Read + Send> = if path.as_os_str() == "-" {
        Box::new(Counted {
            inner: io::stdin(),
            count,
        })
    } else {
        Box::new(Counted {
            inner: File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?,
            count,
        })
    };
    let mut reader = BufReader::with_capacity(1 << 16, raw);
    let head = reader
        .fill_buf()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            MultiGzDecoder::new(reader),
        )))
    } else {
        Ok(Box::new(reader))
    }
}

/// Reads one line into `buf` without its line break (`\n` or `\r\n`), keeping at most
/// `limit` bytes: `Ok(Some(true))` when the line was longer (the rest is skipped),
/// `Ok(None)` at the end.
fn read_line(
    reader: &mut dyn BufRead,
    buf: &mut Vec<u8>,
    limit: usize,
) -> io::Result<Option<bool>> {
    buf.clear();
    let mut long = false;
    let mut any = false;
    loop {
        let chunk = match reader.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            break;
        }
        any = true;
        let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], i + 1),
            None => (chunk, chunk.len()),
        };
        let room = limit.saturating_sub(buf.len());
        if part.len() > room {
            long = true;
        }
        buf.extend_from_slice(&part[..part.len().min(room)]);
        let found = done > part.len();
        reader.consume(done);
        if found {
            break;
        }
    }
    if !any {
        return Ok(None);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(long))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(nanos: u64, whole_second: bool) -> Stamp {
        Stamp {
            nanos,
            whole_second,
        }
    }

    fn times(o: &Orderer) -> Vec<u64> {
        o.out.iter().map(|e| e.at).collect()
    }

    #[test]
    fn a_seconds_requests_spread_evenly_in_log_order() {
        let mut o = Orderer::new(0, Spread::Even, 0);
        for k in 0..4 {
            o.push(stamp(10 * NANOS, true), k, 1);
        }
        o.finish();
        assert_eq!(o.origin_nanos(), 10 * NANOS);
        assert_eq!(times(&o), [0, 250_000_000, 500_000_000, 750_000_000]);
        assert_eq!(
            o.out.iter().map(|e| e.key).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn random_spread_is_seeded_and_stays_inside_the_second() {
        let run = |seed| {
            let mut o = Orderer::new(1, Spread::Random, seed);
            for k in 0..100 {
                o.push(stamp(5 * NANOS, true), k, 1);
            }
            o.finish();
            times(&o)
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // Origin is 4 s (the first second less the 1 s window).
        assert!(a.iter().all(|&t| (NANOS..2 * NANOS).contains(&t)));
    }

    #[test]
    fn late_lines_within_the_window_are_put_in_order() {
        let mut o = Orderer::new(2, Spread::Start, 0);
        o.push(stamp(100 * NANOS + 5, false), 0, 1);
        o.push(stamp(102 * NANOS, true), 1, 1);
        assert_eq!(o.refuse(stamp(100 * NANOS, true)), None);
        o.push(stamp(100 * NANOS, true), 2, 1);
        assert!(
            o.refuse(stamp(99 * NANOS, true))
                .unwrap()
                .contains("3 s earlier")
        );
        o.push(stamp(103 * NANOS, true), 3, 1);
        // Second 100 is complete once 103 arrives (window 2 s): released in order.
        assert_eq!(o.out.iter().map(|e| e.key).collect::<Vec<_>>(), [2, 0]);
        o.finish();
        assert_eq!(
            o.out.iter().map(|e| e.key).collect::<Vec<_>>(),
            [2, 0, 1, 3]
        );
        assert_eq!(times(&o), [2 * NANOS, 2 * NANOS + 5, 4 * NANOS, 5 * NANOS]);
    }

    #[test]
    fn lines_are_read_without_breaks_and_bounded() {
        let text = b"one\r\ntwo\n\nlong-line\nlast";
        let mut r: &[u8] = text;
        let mut buf = Vec::new();
        let mut lines = Vec::new();
        while let Some(long) = read_line(&mut r, &mut buf, 4).unwrap() {
            lines.push((String::from_utf8(buf.clone()).unwrap(), long));
        }
        assert_eq!(
            lines,
            [
                ("one".into(), false),
                ("two".into(), false),
                (String::new(), false),
                ("long".into(), true),
                ("last".into(), false),
            ]
        );
    }
}
