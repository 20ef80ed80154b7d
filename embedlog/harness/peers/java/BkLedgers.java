// BkLedgers: BookKeeper's own client reads several ledgers in one JVM, checking every digest
// with the ledger's DigestManager (its digest type from the metadata).
//
//   java -cp "$CP" BkLedgers.java MODE METADATA_URI PASSWORD LID...
//
//   read           each ledger opened without recovery and read 0..LAC:
//                  "lac LID N", then "entry LID EID HEX" per entry
//   explicit-lac   LedgerHandle.readExplicitLastConfirmed, the one reader that checks the
//                  digest of a LAC body a writer sent with WRITE_LAC: "explicit LID N"
//
// A ledger BookKeeper's client refuses prints "error LID EXCEPTION" (a digest it could not
// verify, an entry missing). Used by tests/interop/test_bookkeeper_wire.py, where one JVM
// for many ledgers is cheaper than one BkDriver run each, and BkDriver has no command for
// readExplicitLastConfirmed.

import java.nio.charset.StandardCharsets;
import java.util.Enumeration;

import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerEntry;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class BkLedgers {
    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder(b.length * 2);
        for (byte x : b) {
            sb.append(Character.forDigit((x >> 4) & 0xf, 16)).append(Character.forDigit(x & 0xf, 16));
        }
        return sb.toString();
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(args[1]);
        conf.setEnableDigestTypeAutodetection(true);   // each ledger's digest from its metadata
        BookKeeper bk = new BookKeeper(conf);
        byte[] password = args[2].getBytes(StandardCharsets.UTF_8);
        for (int i = 3; i < args.length; i++) {
            long lid = Long.parseLong(args[i]);
            try {
                LedgerHandle lh = bk.openLedgerNoRecovery(lid, BookKeeper.DigestType.CRC32, password);
                if (mode.equals("explicit-lac")) {
                    System.out.println("explicit " + lid + " " + lh.readExplicitLastConfirmed());
                } else {
                    long lac = lh.getLastAddConfirmed();
                    System.out.println("lac " + lid + " " + lac);
                    if (lac >= 0) {
                        Enumeration<LedgerEntry> entries = lh.readEntries(0, lac);
                        while (entries.hasMoreElements()) {
                            LedgerEntry e = entries.nextElement();
                            System.out.println("entry " + lid + " " + e.getEntryId() + " " + hex(e.getEntry()));
                        }
                    }
                }
            } catch (Exception e) {
                System.out.println("error " + lid + " " + e);
            }
            System.out.flush();
        }
        Runtime.getRuntime().halt(0);     // BookKeeper.close() waits seconds for its pools
    }
}
