// BkMeta: BookKeeper's own Java code as the oracle of embedlog's BookKeeper metadata formats
// (embedlog/meta/bookkeeper/). Run with the jars of one BookKeeper version on the classpath:
//
//   BkMeta --metadata-uri URI goldens OUTDIR
//       creates one ledger of each kind below through BookKeeper's client (and, for what a
//       client cannot make on demand, its LedgerManager) and writes OUTDIR/manifest.json:
//       what BookKeeper reads back for each (its getters), keyed by the golden's name.
//   BkMeta --metadata-uri URI[|URI...] create-many N [--ensemble E] [--in-flight K]
//       creates N ledgers (E/E/E, CRC32C, empty password) on each root, in turns, K at a
//       time, each closed at once; one line per ledger: "ledger ROOT_INDEX ID"; then "end".
//   BkMeta --conf FILE shell
//       BookieShell commands, one per stdin line (its arguments, space separated; a first
//       word @PATH runs that one with the configuration PATH), run in this one JVM; each
//       is framed by "### begin N" and "### end N RC" on stdout.
//
// Errors: "error MESSAGE" on stdout, exit status 2.

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Semaphore;

import org.apache.bookkeeper.bookie.BookieShell;
import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.client.LedgerMetadataBuilder;
import org.apache.bookkeeper.client.api.LedgerMetadata;
import org.apache.bookkeeper.conf.ClientConfiguration;
import org.apache.bookkeeper.conf.ServerConfiguration;
import org.apache.bookkeeper.net.BookieId;
import org.apache.bookkeeper.util.EntryFormatter;
import org.apache.bookkeeper.util.LedgerIdFormatter;

public class BkMeta {
    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) {
            sb.append(String.format("%02x", x & 0xff));
        }
        return sb.toString();
    }

    static String quote(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                sb.append('\\').append(c);
            } else if (c < 0x20) {
                sb.append(String.format("\\u%04x", (int) c));
            } else {
                sb.append(c);
            }
        }
        return sb.append('"').toString();
    }

    /** What BookKeeper's own getters say of a ledger, as one JSON object. */
    static String describe(long id, LedgerMetadata md) {
        StringBuilder sb = new StringBuilder("{");
        sb.append("\"ledger_id\": ").append(id);
        sb.append(", \"format_version\": ").append(md.getMetadataFormatVersion());
        sb.append(", \"ensemble_size\": ").append(md.getEnsembleSize());
        sb.append(", \"write_quorum\": ").append(md.getWriteQuorumSize());
        sb.append(", \"ack_quorum\": ").append(md.getAckQuorumSize());
        sb.append(", \"state\": ").append(quote(md.getState().name()));
        sb.append(", \"last_entry_id\": ").append(md.getLastEntryId());
        sb.append(", \"length\": ").append(md.getLength());
        sb.append(", \"digest_type\": ").append(quote(md.getDigestType().name()));
        sb.append(", \"password\": ").append(quote(hex(md.getPassword())));
        sb.append(", \"ctime\": ").append(md.getCtime());
        sb.append(", \"ctoken\": ").append(md.getCToken());
        sb.append(", \"custom_metadata\": {");
        String sep = "";
        for (Map.Entry<String, byte[]> e : md.getCustomMetadata().entrySet()) {
            sb.append(sep).append(quote(e.getKey())).append(": ").append(quote(hex(e.getValue())));
            sep = ", ";
        }
        sb.append("}, \"ensembles\": [");
        sep = "";
        for (Map.Entry<Long, ? extends List<BookieId>> e : md.getAllEnsembles().entrySet()) {
            sb.append(sep).append("[").append(e.getKey()).append(", [");
            String s2 = "";
            for (BookieId b : e.getValue()) {
                sb.append(s2).append(quote(b.toString()));
                s2 = ", ";
            }
            sb.append("]]");
            sep = ", ";
        }
        return sb.append("]}").toString();
    }

    static ClientConfiguration clientConf(String uri) {
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(uri);
        conf.setZkTimeout(10000);
        return conf;
    }

    static void goldens(String uri, String outDir) throws Exception {
        Map<String, Long> made = new LinkedHashMap<>();
        Map<String, LedgerMetadata> seen = new LinkedHashMap<>();
        byte[] password = "golden-password".getBytes(StandardCharsets.UTF_8);
        try (BookKeeper bk = new BookKeeper(clientConf(uri))) {
            // an open ledger (its writer never closes it) with custom metadata
            Map<String, byte[]> custom = new LinkedHashMap<>();
            custom.put("application", "embedlog-golden".getBytes(StandardCharsets.UTF_8));
            custom.put("binary", new byte[] {0, 1, 2, (byte) 0x7f, (byte) 0x80, (byte) 0xff});
            LedgerHandle open = bk.createLedger(3, 3, 2, BookKeeper.DigestType.CRC32C, password, custom);
            open.addEntry("first".getBytes(StandardCharsets.UTF_8));
            made.put("open_crc32c_custom", open.getId());

            LedgerHandle closed = bk.createLedger(3, 2, 2, BookKeeper.DigestType.CRC32, password);
            for (int i = 0; i < 10; i++) {
                closed.addEntry(("entry-" + i).getBytes(StandardCharsets.UTF_8));
            }
            closed.close();
            made.put("closed_crc32_entries", closed.getId());

            LedgerHandle mac = bk.createLedger(1, 1, 1, BookKeeper.DigestType.MAC, password);
            mac.close();
            made.put("closed_mac_empty", mac.getId());

            LedgerHandle dummy = bk.createLedger(2, 2, 1, BookKeeper.DigestType.DUMMY, new byte[0]);
            dummy.addEntry(new byte[100]);
            dummy.close();
            made.put("closed_dummy_nopassword", dummy.getId());

            // an id past 2^31 - 1: hierarchical puts it in the long (3-4-4-4-4) tree
            LedgerHandle big = bk.createLedgerAdv((1L << 40) + 12345, 1, 1, 1,
                                                  BookKeeper.DigestType.CRC32C, password, null);
            big.addEntry(0, "x".getBytes(StandardCharsets.UTF_8));
            big.close();
            made.put("long_id", big.getId());

            // two segments and IN_RECOVERY: written through BookKeeper's LedgerManager,
            // as an ensemble change and a recovery in progress leave them
            List<BookieId> first = new ArrayList<>(open.getLedgerMetadata().getAllEnsembles().get(0L));
            List<BookieId> second = new ArrayList<>(first);
            second.set(1, BookieId.parse("127.0.0.1:1"));
            long segId = (1L << 20) + 7;
            LedgerMetadata segMd = LedgerMetadataBuilder.create().withId(segId)
                .withEnsembleSize(3).withWriteQuorumSize(3).withAckQuorumSize(2)
                .withDigestType(org.apache.bookkeeper.client.api.DigestType.CRC32C).withPassword(password)
                .newEnsembleEntry(0L, first).newEnsembleEntry(5L, second)
                .withInRecoveryState().build();
            bk.getLedgerManager().createLedgerMetadata(segId, segMd).get();
            made.put("two_segments_in_recovery", segId);

            long closedSegId = (1L << 20) + 8;
            LedgerMetadata closedSeg = LedgerMetadataBuilder.create().withId(closedSegId)
                .withEnsembleSize(3).withWriteQuorumSize(2).withAckQuorumSize(2)
                .withDigestType(org.apache.bookkeeper.client.api.DigestType.MAC).withPassword(password)
                .newEnsembleEntry(0L, first).newEnsembleEntry(3L, second).newEnsembleEntry(9L, first)
                .withClosedState().withLastEntryId(11L).withLength(4096L)
                .withCreationTime(1700000000123L).storingCreationTime(true).build();
            bk.getLedgerManager().createLedgerMetadata(closedSegId, closedSeg).get();
            made.put("three_segments_closed_ctime", closedSegId);
        }

        ClientConfiguration ctimeConf = clientConf(uri);
        ctimeConf.setStoreSystemtimeAsLedgerCreationTime(true);
        try (BookKeeper bk = new BookKeeper(ctimeConf)) {
            LedgerHandle lh = bk.createLedger(2, 2, 2, BookKeeper.DigestType.CRC32C, password);
            lh.addEntry("with ctime".getBytes(StandardCharsets.UTF_8));
            lh.close();
            made.put("closed_stored_ctime", lh.getId());
        }

        ClientConfiguration v2Conf = clientConf(uri);
        v2Conf.setLedgerMetadataFormatVersion(2);
        try (BookKeeper bk = new BookKeeper(v2Conf)) {
            Map<String, byte[]> custom = new LinkedHashMap<>();
            custom.put("tab\there", "quote\"back\\slash\n".getBytes(StandardCharsets.UTF_8));
            LedgerHandle lh = bk.createLedger(3, 3, 3, BookKeeper.DigestType.CRC32, password, custom);
            lh.addEntry("v2".getBytes(StandardCharsets.UTF_8));
            lh.close();
            made.put("v2_text_closed", lh.getId());
        }

        try (BookKeeper bk = new BookKeeper(clientConf(uri))) {
            for (Map.Entry<String, Long> e : made.entrySet()) {
                seen.put(e.getKey(), bk.getLedgerManager().readLedgerMetadata(e.getValue()).get().getValue());
            }
        }
        StringBuilder sb = new StringBuilder("{\n");
        String sep = "";
        for (Map.Entry<String, LedgerMetadata> e : seen.entrySet()) {
            sb.append(sep).append("  ").append(quote(e.getKey())).append(": ")
              .append(describe(made.get(e.getKey()), e.getValue()));
            sep = ",\n";
        }
        sb.append("\n}\n");
        Files.write(Paths.get(outDir, "manifest.json"), sb.toString().getBytes(StandardCharsets.UTF_8));
        System.out.println("end");
    }

    static void createMany(String uris, int count, int ensemble, int inFlight) throws Exception {
        // one client per root, creating in turns: one JVM races embedlog on every root
        List<BookKeeper> clients = new ArrayList<>();
        try {
            for (String uri : uris.split("\\|")) {
                clients.add(new BookKeeper(clientConf(uri)));
            }
            Semaphore permits = new Semaphore(inFlight);
            List<CompletableFuture<Void>> all = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                for (int c = 0; c < clients.size(); c++) {
                    final int root = c;
                    permits.acquire();
                    CompletableFuture<Void> done = new CompletableFuture<>();
                    all.add(done);
                    clients.get(c).asyncCreateLedger(ensemble, ensemble, ensemble,
                        BookKeeper.DigestType.CRC32C, new byte[0], (rc, lh, ctx) -> {
                            permits.release();
                            if (rc != 0) {
                                done.completeExceptionally(new RuntimeException("create failed: rc " + rc));
                                return;
                            }
                            synchronized (BkMeta.class) {
                                System.out.println("ledger " + root + " " + lh.getId());
                                System.out.flush();
                            }
                            lh.asyncClose((rc2, lh2, ctx2) -> done.complete(null), null);
                        }, null, null);
                }
            }
            CompletableFuture.allOf(all.toArray(new CompletableFuture[0])).get();
        } finally {
            for (BookKeeper bk : clients) {
                bk.close();
            }
        }
        System.out.println("end");
    }

    static ServerConfiguration loadConf(String confFile) throws Exception {
        // a ServerConfiguration is the CompositeConfiguration of whichever commons-configuration
        // this version uses (4.16: 1.x, 4.17: 2.x), so one source compiles against both
        ServerConfiguration conf = new ServerConfiguration();
        conf.loadConf(new File(confFile).toURI().toURL());
        return conf;
    }

    static void shell(String confFile) throws Exception {
        ServerConfiguration defaultConf = loadConf(confFile);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        int n = 0;
        while ((line = in.readLine()) != null) {
            List<String> words = new ArrayList<>(Arrays.asList(line.trim().split("\\s+")));
            if (line.trim().isEmpty()) {
                continue;
            }
            ServerConfiguration conf = defaultConf;
            if (words.get(0).startsWith("@")) {
                conf = loadConf(words.remove(0).substring(1));
            }
            BookieShell sh = new BookieShell(LedgerIdFormatter.LONG_LEDGERID_FORMATTER,
                                             EntryFormatter.STRING_FORMATTER);
            sh.setConf(conf);
            System.out.println("### begin " + n);
            System.out.flush();
            int rc;
            try {
                rc = sh.run(words.toArray(new String[0]));
            } catch (Throwable t) {
                System.out.println("exception " + t);
                rc = -99;
            }
            System.out.flush();
            System.err.flush();
            System.out.println("### end " + n + " " + rc);
            System.out.flush();
            n++;
        }
    }

    public static void main(String[] args) {
        try {
            List<String> a = new ArrayList<>(Arrays.asList(args));
            Map<String, String> opts = new LinkedHashMap<>();
            for (int i = 0; i < a.size() - 1; ) {
                if (a.get(i).startsWith("--")) {
                    opts.put(a.remove(i), a.remove(i));
                } else {
                    i++;
                }
            }
            String cmd = a.isEmpty() ? "" : a.get(0);
            switch (cmd) {
                case "goldens":
                    goldens(opts.get("--metadata-uri"), a.get(1));
                    break;
                case "create-many":
                    createMany(opts.get("--metadata-uri"), Integer.parseInt(a.get(1)),
                               Integer.parseInt(opts.getOrDefault("--ensemble", "1")),
                               Integer.parseInt(opts.getOrDefault("--in-flight", "8")));
                    break;
                case "shell":
                    shell(opts.get("--conf"));
                    break;
                default:
                    System.out.println("error unknown command " + cmd);
                    System.exit(2);
            }
            System.out.flush();
            System.exit(0);
        } catch (Throwable t) {
            System.out.println("error " + t);
            t.printStackTrace();
            System.out.flush();
            System.exit(2);
        }
    }
}
