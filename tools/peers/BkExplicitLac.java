// BkExplicitLac: BookKeeper's own client reads the explicit LAC of ledgers (what a writer
// sent with WRITE_LAC), checking its digest with the ledger's DigestManager.
//
//   java -cp "$CP" BkExplicitLac.java METADATA_URI PASSWORD LID...
//
// Prints "explicit LID LAC" for each ledger, or "error LID EXCEPTION" when BookKeeper's
// client refused the LAC body (a digest it could not verify). Used by
// tests/interop/test_bookkeeper_wire.py: BkDriver has no command for
// LedgerHandle.readExplicitLastConfirmed, the one reader that checks a LAC body's digest.

import java.nio.charset.StandardCharsets;

import org.apache.bookkeeper.client.BookKeeper;
import org.apache.bookkeeper.client.LedgerHandle;
import org.apache.bookkeeper.conf.ClientConfiguration;

public class BkExplicitLac {
    public static void main(String[] args) throws Exception {
        ClientConfiguration conf = new ClientConfiguration();
        conf.setMetadataServiceUri(args[0]);
        conf.setEnableDigestTypeAutodetection(true);   // each ledger's digest from its metadata
        BookKeeper bk = new BookKeeper(conf);
        byte[] password = args[1].getBytes(StandardCharsets.UTF_8);
        for (int i = 2; i < args.length; i++) {
            long lid = Long.parseLong(args[i]);
            LedgerHandle lh = bk.openLedgerNoRecovery(lid, BookKeeper.DigestType.CRC32, password);
            try {
                System.out.println("explicit " + lid + " " + lh.readExplicitLastConfirmed());
            } catch (Exception e) {
                System.out.println("error " + lid + " " + e);
            }
            System.out.flush();
        }
        Runtime.getRuntime().halt(0);     // BookKeeper.close() waits seconds for its pools
    }
}
