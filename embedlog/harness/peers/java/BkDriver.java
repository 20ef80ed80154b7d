// BkDriver: BookKeeper's own Java client, driven line by line from a Python test.
//
// Used by embedlog/harness/peers/bookkeeper.py for what BookieShell cannot drive (our code, run
// against the jars of one BookKeeper version; compiled once per version into the jar cache).
//
//   BkDriver --metadata-uri URI [--v2] [--zk-timeout-ms T] [--throttle R] COMMAND ARGS
//
//   --throttle R: the client's rate limit, R adds and reads a second (ClientConfiguration's
//   throttle, 5000 unless given; 0: none). bench runs without one unless given.
//   --explicit-lac-ms T: a writer sends its LAC to its bookies (WRITE_LAC) after T ms
//   without an add that carried it (explicitLacInterval; Pulsar sets one).
//   --batch-read: batch reads on (batchReadEnabled, BookKeeper 4.17 on; usage error before)
//   --add-timeout-s / --read-timeout-s S: the client's add and read timeouts (10 s)
//
//   create --ensemble E --write-quorum W --ack-quorum A [--digest D] [--password P]
//          [--count N] [--size B] [--stdin] [--outstanding K] [--no-close]
//          [--custom-metadata K=V,K=V] [--ledger-id L]
//       creates a ledger (with the custom metadata, values UTF-8) and appends N entries
//       "entry-<id>" (padded with '.' to B bytes if B is larger), or with --stdin one entry
//       per input line (hex; an empty line is an empty entry) until end of input. With
//       --ledger-id L it is created with that id (createLedgerAdv: makeAdv().withLedgerId)
//       and written with explicit entry ids 0, 1, ...
//   read LID [--password P] [--digest D] [--recover] [--from F] [--to T] [--batch N]
//        [--explicit-lac]
//       opens with recovery (fences and closes) or without, reads F..T (default all up to
//       LAC); with --batch N through batchRead, N entries a call at most (4.17 on; the
//       client batches only with --batch-read --v2 and E = Qw); --explicit-lac first
//       prints "explicitlac N" (LedgerHandle.readExplicitLastConfirmed: READ_LAC)
//   tail LID [--password P] [--digest D] [--from F] [--count N] [--poll-ms T] [--idle-ms T]
//        [--poll-lac]
//       long-poll reader: prints entries as the writer's LAC passes them; stops after N
//       entries, when the ledger is closed and read to its end, or after idle-ms with nothing;
//       with --poll-lac it polls readLastAddConfirmed every poll-ms instead (Pulsar's
//       tailing readers), reading what the LAC passed
//   close LID [--password P] [--digest D]
//       recovery open: fences the ledger, settles its last entry and closes it
//   bench --ensemble E --write-quorum W --ack-quorum A [--digest D] [--size B] [--count N]
//         [--outstanding K] [--warmup N]
//       one JSON line: adds, seconds, adds_per_s, p50_ms, p99_ms, p999_ms, max_ms, cpu_s
//       (the JVM's CPU time over the timed adds, every thread); before it the lines
//       "clock start" (the warm-up is acknowledged, the clock starts) and "clock stop" (the
//       last timed add is acknowledged), so a caller can measure a bookie over the same span
//
// Output, one event a line, flushed at once so a test may SIGKILL the driver between lines:
//   ledger LID | ack EID | ensemble FIRST_EID B1,B2,... | lac N | length BYTES | closed BOOL
//   entry EID HEX | explicitlac N | meta KEY HEX | batch FIRST_EID COUNT | end
//   error CODE NAME MESSAGE (exit status 2) | usage MESSAGE (status 64)
// Digest names are api.DigestType's (CRC32C, CRC32, MAC, DUMMY); without --digest a reader
// takes the ledger's own digest from its metadata. Passwords are UTF-8 text.

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.bookkeeper.client.api.BKException;
import org.apache.bookkeeper.client.api.BookKeeper;
import org.apache.bookkeeper.client.api.CreateBuilder;
import org.apache.bookkeeper.client.api.DigestType;
import org.apache.bookkeeper.client.api.LastConfirmedAndEntry;
import org.apache.bookkeeper.client.api.LedgerEntries;
import org.apache.bookkeeper.client.api.LedgerEntry;
import org.apache.bookkeeper.client.api.LedgerMetadata;
import org.apache.bookkeeper.client.api.OpenBuilder;
import org.apache.bookkeeper.client.api.ReadHandle;
import org.apache.bookkeeper.client.api.WriteAdvHandle;
import org.apache.bookkeeper.client.api.WriteHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class BkDriver {
    static final int EXIT_ERROR = 2;
    static final int EXIT_USAGE = 64;
    static final Set<String> FLAGS = new HashSet<>(Arrays.asList(
        "--v2", "--stdin", "--recover", "--no-close", "--batch-read", "--explicit-lac",
        "--poll-lac"));

    /** Thrown for bad arguments: printed as "usage ...". */
    static final class Usage extends RuntimeException {
        Usage(String message) { super(message); }
    }

    final Map<String, String> opts = new HashMap<>();
    final List<String> positional = new ArrayList<>();

    BkDriver(String[] args) {
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (FLAGS.contains(a)) {
                opts.put(a, "true");
            } else if (a.startsWith("--")) {
                if (i + 1 >= args.length) {
                    throw new Usage(a + " needs a value");
                }
                opts.put(a, args[++i]);
            } else {
                positional.add(a);
            }
        }
    }

    static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    String opt(String name, String dflt) {
        String v = opts.get(name);
        return v == null ? dflt : v;
    }

    boolean flag(String name) {
        return opts.containsKey(name);
    }

    long num(String name, long dflt) {
        String v = opts.get(name);
        if (v == null) {
            return dflt;
        }
        try {
            return Long.parseLong(v);
        } catch (NumberFormatException e) {
            throw new Usage(name + " takes a number, got " + v);
        }
    }

    long require(String name) {
        if (!opts.containsKey(name)) {
            throw new Usage(name + " is required");
        }
        return num(name, 0);
    }

    DigestType digest(String dflt) {
        String v = opt("--digest", dflt);
        if (v == null) {
            return null;
        }
        try {
            return DigestType.valueOf(v.toUpperCase());
        } catch (IllegalArgumentException e) {
            throw new Usage("--digest is one of CRC32C, CRC32, MAC, DUMMY; got " + v);
        }
    }

    byte[] password() {
        return opt("--password", "").getBytes(StandardCharsets.UTF_8);
    }

    long ledgerArg() {
        if (positional.size() < 2) {
            throw new Usage(positional.get(0) + " needs a ledger id");
        }
        try {
            return Long.parseLong(positional.get(1));
        } catch (NumberFormatException e) {
            throw new Usage("ledger id is a number, got " + positional.get(1));
        }
    }

    /** A client that is never closed: main halts the JVM instead, since BookKeeper.close()
     *  waits seconds for its worker pools ("mainWorkerPool did not shutdown cleanly"). */
    BookKeeper connect(boolean autodetectDigest) throws Exception {
        String uri = opts.get("--metadata-uri");
        if (uri == null) {
            throw new Usage("--metadata-uri zk+hierarchical://HOST:PORT/ROOT is required");
        }
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        conf.setZkTimeout((int) num("--zk-timeout-ms", 10000));
        conf.setUseV2WireProtocol(flag("--v2"));
        conf.setEnableDigestTypeAutodetection(autodetectDigest);
        conf.setAddEntryTimeout((int) num("--add-timeout-s", 10));
        conf.setReadEntryTimeout((int) num("--read-timeout-s", 10));
        // the client's own rate limit (a RateLimiter of adds and reads per second, 5000 by
        // default; 0 turns it off): BenchThroughputLatency sets it to its -throttle
        conf.setThrottleValue((int) num("--throttle", conf.getThrottleValue()));
        conf.setExplictLacInterval((int) num("--explicit-lac-ms", 0));
        if (flag("--batch-read")) {
            // 4.17's setting, called by name: this source compiles against 4.16 too
            try {
                conf.getClass().getMethod("setBatchReadEnabled", boolean.class).invoke(conf, true);
            } catch (NoSuchMethodException e) {
                throw new Usage("--batch-read needs BookKeeper 4.17 or later");
            }
        }
        return BookKeeper.newBuilder(conf).build();
    }

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder(b.length * 2);
        for (byte x : b) {
            sb.append(Character.forDigit((x >> 4) & 0xf, 16))
              .append(Character.forDigit(x & 0xf, 16));
        }
        return sb.toString();
    }

    static byte[] unhex(String s) {
        if (s.length() % 2 != 0) {
            throw new Usage("odd-length hex payload");
        }
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) {
            int hi = Character.digit(s.charAt(2 * i), 16);
            int lo = Character.digit(s.charAt(2 * i + 1), 16);
            if (hi < 0 || lo < 0) {
                throw new Usage("payload is not hex: " + s);
            }
            out[i] = (byte) ((hi << 4) | lo);
        }
        return out;
    }

    /** The generated payload of entry id: "entry-<id>", padded with '.' to size bytes. */
    static byte[] payload(long id, int size) {
        byte[] text = ("entry-" + id).getBytes(StandardCharsets.US_ASCII);
        if (size <= text.length) {
            return text;
        }
        byte[] out = new byte[size];
        Arrays.fill(out, (byte) '.');
        System.arraycopy(text, 0, out, 0, text.length);
        return out;
    }

    static void printEnsembles(LedgerMetadata md) {
        md.getAllEnsembles().forEach((first, bookies) -> {
            StringBuilder sb = new StringBuilder();
            for (Object b : bookies) {
                sb.append(sb.length() == 0 ? "" : ",").append(b);
            }
            emit("ensemble " + first + " " + sb);
        });
    }

    /** The create builder from --ensemble, --write-quorum, --ack-quorum and the rest. */
    CreateBuilder createBuilder(BookKeeper bk) {
        return bk.newCreateLedgerOp()
            .withEnsembleSize((int) require("--ensemble"))
            .withWriteQuorumSize((int) require("--write-quorum"))
            .withAckQuorumSize((int) require("--ack-quorum"))
            .withDigestType(digest("CRC32C"))
            .withPassword(password())
            .withCustomMetadata(customMetadata());
    }

    WriteHandle createLedger(BookKeeper bk) throws Exception {
        return createBuilder(bk).execute().get();
    }

    /** createLedgerAdv with the id --ledger-id names (an id used before comes back). */
    WriteAdvHandle createLedgerAdv(BookKeeper bk) throws Exception {
        return createBuilder(bk).makeAdv().withLedgerId(require("--ledger-id")).execute().get();
    }

    /** --custom-metadata K=V,K=V as the ledger's custom metadata (values UTF-8). */
    Map<String, byte[]> customMetadata() {
        Map<String, byte[]> md = new HashMap<>();
        String spec = opt("--custom-metadata", "");
        for (String kv : spec.isEmpty() ? new String[0] : spec.split(",")) {
            int eq = kv.indexOf('=');
            if (eq <= 0) {
                throw new Usage("--custom-metadata takes K=V,K=V; got " + kv);
            }
            md.put(kv.substring(0, eq), kv.substring(eq + 1).getBytes(StandardCharsets.UTF_8));
        }
        return md;
    }

    static void printCustomMetadata(LedgerMetadata md) {
        new java.util.TreeMap<>(md.getCustomMetadata()).forEach(
            (k, v) -> emit("meta " + k + " " + hex(v)));
    }

    /** entries first..last through ReadHandle.batchRead (4.17 on), at most n a call. */
    static void batchRead(ReadHandle rh, long first, long last, int n) throws Exception {
        java.lang.reflect.Method m;
        try {
            m = ReadHandle.class.getMethod("batchRead", long.class, int.class, long.class);
        } catch (NoSuchMethodException e) {
            throw new Usage("--batch needs BookKeeper 4.17 or later");
        }
        for (long next = first; next <= last; ) {
            int want = (int) Math.min(n, last - next + 1);
            LedgerEntries got;
            try {
                got = (LedgerEntries) m.invoke(rh, next, want, 5L << 20);
            } catch (java.lang.reflect.InvocationTargetException e) {
                throw asException(e.getCause());
            }
            try (LedgerEntries entries = got) {
                long count = 0;
                for (LedgerEntry e : entries) {
                    emit("entry " + e.getEntryId() + " " + hex(e.getEntryBytes()));
                    count++;
                }
                emit("batch " + next + " " + count);
                if (count == 0) {
                    throw new IllegalStateException("batchRead from " + next + " gave nothing");
                }
                next += count;
            }
        }
    }

    ReadHandle openLedger(BookKeeper bk, long lid, boolean recover) throws Exception {
        OpenBuilder op = bk.newOpenLedgerOp().withLedgerId(lid).withRecovery(recover)
            .withPassword(password());
        DigestType d = digest(null);
        if (d != null) {
            op = op.withDigestType(d);
        }
        return op.execute().get();
    }

    int create() throws Exception {
        long count = num("--count", 0);
        int size = (int) num("--size", 0);
        int outstanding = (int) Math.max(1, num("--outstanding", 1));
        BookKeeper bk = connect(false);
        WriteAdvHandle adv = opts.containsKey("--ledger-id") ? createLedgerAdv(bk) : null;
        WriteHandle plain = adv == null ? createLedger(bk) : null;
        org.apache.bookkeeper.client.api.Handle wh = adv != null ? adv : plain;
        emit("ledger " + wh.getId());
        printEnsembles(wh.getLedgerMetadata());
        Semaphore window = new Semaphore(outstanding);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        java.io.BufferedReader in = flag("--stdin")
            ? new java.io.BufferedReader(new java.io.InputStreamReader(System.in)) : null;
        for (long i = 0; in != null || i < count; i++) {
            byte[] data;
            if (in != null) {
                String line = in.readLine();
                if (line == null) {
                    break;
                }
                data = unhex(line.trim());
            } else {
                data = payload(i, size);
            }
            window.acquire();
            if (failure.get() != null) {
                break;
            }
            CompletableFuture<Long> add = adv != null ? adv.writeAsync(i, data) : plain.appendAsync(data);
            add.whenComplete((eid, err) -> {
                if (err != null) {
                    failure.compareAndSet(null, err);
                } else {
                    emit("ack " + eid);
                }
                window.release();
            });
        }
        window.acquire(outstanding);        // every append has completed
        if (failure.get() != null) {
            throw asException(failure.get());
        }
        boolean close = !flag("--no-close");   // else the ledger stays open, as a dead writer's
        if (close) {
            wh.close();
        }
        printEnsembles(wh.getLedgerMetadata());
        emit("lac " + (adv != null ? adv.getLastAddConfirmed() : plain.getLastAddConfirmed()));
        emit("closed " + close);
        emit("end");
        return 0;
    }

    int read() throws Exception {
        long lid = ledgerArg();
        BookKeeper bk = connect(!opts.containsKey("--digest"));
        try (ReadHandle rh = openLedger(bk, lid, flag("--recover"))) {
            long lac = rh.getLastAddConfirmed();
            emit("lac " + lac);
            emit("length " + rh.getLength());
            emit("closed " + rh.isClosed());
            printEnsembles(rh.getLedgerMetadata());
            printCustomMetadata(rh.getLedgerMetadata());
            if (flag("--explicit-lac")) {
                emit("explicitlac "
                     + ((org.apache.bookkeeper.client.LedgerHandle) rh).readExplicitLastConfirmed());
            }
            long first = num("--from", 0);
            long last = num("--to", rh.getLastAddConfirmed());   // an explicit LAC raises it
            if (first <= last && last >= 0 && opts.containsKey("--batch")) {
                batchRead(rh, first, last, (int) Math.max(1, num("--batch", 1)));
            } else if (first <= last && last >= 0) {
                try (LedgerEntries entries = rh.read(first, last)) {
                    for (LedgerEntry e : entries) {
                        emit("entry " + e.getEntryId() + " " + hex(e.getEntryBytes()));
                    }
                }
            }
            emit("end");
        }
        return 0;
    }

    int tail() throws Exception {
        long lid = ledgerArg();
        long next = num("--from", 0);
        long limit = num("--count", Long.MAX_VALUE);
        long pollMs = num("--poll-ms", 1000);
        long idleMs = num("--idle-ms", 30000);
        long seen = 0;
        BookKeeper bk = connect(!opts.containsKey("--digest"));
        try (ReadHandle rh = openLedger(bk, lid, false)) {
            long idleSince = System.nanoTime();
            while (seen < limit && flag("--poll-lac")) {
                // Pulsar's tailing reader: ask the bookies for the LAC, read what it passed
                long lac = rh.readLastAddConfirmed();
                if (lac >= next) {
                    try (LedgerEntries es = rh.read(next, Math.min(lac, next + limit - seen - 1))) {
                        for (LedgerEntry e : es) {
                            emit("entry " + e.getEntryId() + " " + hex(e.getEntryBytes()));
                            next = e.getEntryId() + 1;
                            seen++;
                        }
                    }
                    idleSince = System.nanoTime();
                    continue;
                }
                if ((System.nanoTime() - idleSince) / 1_000_000 > idleMs) {
                    emit("idle " + next);
                    break;
                }
                Thread.sleep(pollMs);
            }
            while (seen < limit && !flag("--poll-lac")) {
                try (LastConfirmedAndEntry le =
                         rh.readLastAddConfirmedAndEntry(next, pollMs, false)) {
                    if (le.hasEntry()) {
                        LedgerEntry e = le.getEntry();
                        emit("entry " + e.getEntryId() + " " + hex(e.getEntryBytes()));
                        next = e.getEntryId() + 1;
                        seen++;
                        idleSince = System.nanoTime();
                        continue;
                    }
                    if (le.getLastAddConfirmed() >= next) {
                        // the LAC passed next without the entry piggybacked: read it plainly
                        try (LedgerEntries es = rh.read(next, le.getLastAddConfirmed())) {
                            for (LedgerEntry e : es) {
                                emit("entry " + e.getEntryId() + " " + hex(e.getEntryBytes()));
                                next = e.getEntryId() + 1;
                                seen++;
                            }
                        }
                        idleSince = System.nanoTime();
                        continue;
                    }
                }
                // a closed ledger read to its end has nothing more to give
                LedgerMetadata md = bk.getLedgerMetadata(lid).get();
                if (md.isClosed() && next > md.getLastEntryId()) {
                    emit("closed true");
                    break;
                }
                if ((System.nanoTime() - idleSince) / 1_000_000 > idleMs) {
                    emit("idle " + next);
                    break;
                }
            }
            emit("lac " + (next - 1));
            emit("end");
        }
        return 0;
    }

    int close() throws Exception {
        long lid = ledgerArg();
        BookKeeper bk = connect(!opts.containsKey("--digest"));
        try (ReadHandle rh = openLedger(bk, lid, true)) {
            emit("lac " + rh.getLastAddConfirmed());
            emit("length " + rh.getLength());
            emit("closed " + rh.isClosed());
            printEnsembles(rh.getLedgerMetadata());
            emit("end");
        }
        return 0;
    }

    int bench() throws Exception {
        long count = num("--count", 10000);
        long warmup = num("--warmup", Math.min(1000, count / 10));
        int size = (int) num("--size", 100);
        int outstanding = (int) Math.max(1, num("--outstanding", 100));
        byte[] data = new byte[size];
        Arrays.fill(data, (byte) 'x');
        opts.putIfAbsent("--throttle", "0");   // the Semaphore is the only bound, as a window
        BookKeeper bk = connect(false);
        WriteHandle wh = createLedger(bk);
        Semaphore window = new Semaphore(outstanding);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        long[] latencyNs = new long[(int) count];
        long start = 0;
        long cpuStart = 0;
        for (long i = -warmup; i < count && failure.get() == null; i++) {
            window.acquire();
            if (i == 0) {
                window.acquire(outstanding - 1);  // warm-up drained before the clock starts
                window.release(outstanding - 1);
                emit("clock start");
                start = System.nanoTime();
                cpuStart = processCpuNs();
            }
            final long idx = i;
            final long sent = System.nanoTime();
            wh.appendAsync(data).whenComplete((eid, err) -> {
                if (err != null) {
                    failure.compareAndSet(null, err);
                } else if (idx >= 0) {
                    latencyNs[(int) idx] = System.nanoTime() - sent;
                }
                window.release();
            });
        }
        window.acquire(outstanding);
        long elapsed = System.nanoTime() - start;
        long cpu = processCpuNs() - cpuStart;
        emit("clock stop");
        if (failure.get() != null) {
            throw asException(failure.get());
        }
        wh.close();
        Arrays.sort(latencyNs);
        double seconds = elapsed / 1e9;
        emit(String.format(java.util.Locale.ROOT,
            "{\"adds\": %d, \"size\": %d, \"outstanding\": %d, \"seconds\": %.3f, "
            + "\"adds_per_s\": %.1f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"p999_ms\": %.3f, "
            + "\"max_ms\": %.3f, \"cpu_s\": %.3f}",
            count, size, outstanding, seconds, count / seconds, pct(latencyNs, 0.50),
            pct(latencyNs, 0.99), pct(latencyNs, 0.999), latencyNs[latencyNs.length - 1] / 1e6,
            cpu / 1e9));
        return 0;
    }

    /** CPU time of the whole JVM (every thread: the client's, its JIT's, its GC's). */
    static long processCpuNs() {
        java.lang.management.OperatingSystemMXBean os =
            java.lang.management.ManagementFactory.getOperatingSystemMXBean();
        return os instanceof com.sun.management.OperatingSystemMXBean
            ? ((com.sun.management.OperatingSystemMXBean) os).getProcessCpuTime() : 0;
    }

    static double pct(long[] sorted, double q) {
        int i = (int) Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1);
        return sorted[Math.max(0, i)] / 1e6;
    }

    static Exception asException(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException)
               && t.getCause() != null) {
            t = t.getCause();
        }
        return t instanceof Exception ? (Exception) t : new RuntimeException(t);
    }

    int run() throws Exception {
        if (positional.isEmpty()) {
            throw new Usage("a command: create, read, tail, close, bench");
        }
        switch (positional.get(0)) {
            case "create": return create();
            case "read": return read();
            case "tail": return tail();
            case "close": return close();
            case "bench": return bench();
            default: throw new Usage("unknown command " + positional.get(0));
        }
    }

    public static void main(String[] args) {
        int status;
        try {
            status = new BkDriver(args).run();
        } catch (Usage u) {
            emit("usage " + u.getMessage());
            status = EXIT_USAGE;
        } catch (Throwable t) {
            Exception e = asException(t);
            int code = e instanceof BKException ? ((BKException) e).getCode() : 0;
            emit("error " + code + " " + e.getClass().getSimpleName() + " "
                 + String.valueOf(e.getMessage()).replace('\n', ' '));
            status = EXIT_ERROR;
        }
        System.out.flush();
        // BookKeeper's pools may hold non-daemon threads for a while after close
        Runtime.getRuntime().halt(status);
    }
}
