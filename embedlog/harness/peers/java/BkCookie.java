// BkCookie: BookKeeper's own Cookie class reads bookies' cookies from a root (the oracle that
// an embedlog bookie's cookie is one a Java tool accepts; BookieShell's cookie_get takes only
// <host>:<port> bookie ids). Run with the jars of one BookKeeper version on the classpath:
//
//   BkCookie METADATA_URI BOOKIE_ID...
//       per bookie: "cookie ID VERSION", then the cookie as Cookie.toString() prints it
//       (its layout version, then its text format), then "end"; or "error ID MESSAGE".
//       Exit status 2 when any failed.

import org.apache.bookkeeper.bookie.Cookie;
import org.apache.bookkeeper.conf.ServerConfiguration;
import org.apache.bookkeeper.meta.MetadataDrivers;
import org.apache.bookkeeper.net.BookieId;
import org.apache.bookkeeper.versioning.LongVersion;
import org.apache.bookkeeper.versioning.Versioned;

public class BkCookie {
    public static void main(String[] args) throws Exception {
        ServerConfiguration conf = new ServerConfiguration();
        conf.setMetadataServiceUri(args[0]);
        boolean failed = MetadataDrivers.runFunctionWithRegistrationManager(conf, rm -> {
            boolean any = false;
            for (int i = 1; i < args.length; i++) {
                try {
                    Versioned<Cookie> v = Cookie.readFromRegistrationManager(rm, BookieId.parse(args[i]));
                    long version = ((LongVersion) v.getVersion()).getLongVersion();
                    System.out.println("cookie " + args[i] + " " + version);
                    System.out.print(v.getValue().toString());
                    System.out.println("end");
                } catch (Exception e) {
                    System.out.println("error " + args[i] + " " + e);
                    any = true;
                }
            }
            return any;
        });
        System.out.flush();
        System.exit(failed ? 2 : 0);
    }
}
