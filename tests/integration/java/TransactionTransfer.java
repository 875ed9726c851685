// The MongoDB Java driver's ClientSession.withTransaction against a shardlog router: moves a
// value between two documents (on two shards, by the test's set-up), then a transaction it
// aborts.  Prints what it saw; tests/integration/test_transactions_java.py runs it (one JVM,
// the source-file launcher, against the driver jars `make ycsb-java` fetched) and checks.
//
//     java -cp '<ycsb libs>/*' TransactionTransfer.java mongodb://127.0.0.1:27017/

import com.mongodb.client.ClientSession;
import com.mongodb.client.MongoClient;
import com.mongodb.client.MongoClients;
import com.mongodb.client.MongoCollection;
import com.mongodb.client.model.Filters;
import com.mongodb.client.model.Sorts;
import com.mongodb.client.model.Updates;
import java.util.ArrayList;
import java.util.List;
import org.bson.Document;

public class TransactionTransfer {
    static List<Integer> values(MongoCollection<Document> coll, ClientSession session) {
        List<Integer> out = new ArrayList<>();
        var found = session == null ? coll.find() : coll.find(session);
        for (Document d : found.sort(Sorts.ascending("k"))) {
            out.add(d.getInteger("v"));
        }
        return out;
    }

    public static void main(String[] args) {
        try (MongoClient client = MongoClients.create(args[0])) {
            MongoCollection<Document> acct = client.getDatabase("bank").getCollection("acct");
            try (ClientSession session = client.startSession()) {
                String seen = session.withTransaction(() -> {
                    acct.updateOne(session, Filters.eq("k", 1), Updates.inc("v", -25));
                    acct.updateOne(session, Filters.eq("k", 150), Updates.inc("v", 25));
                    return "inside " + values(acct, session) + " outside " + values(acct, null);
                });
                System.out.println(seen);
                System.out.println("token " + session.getRecoveryToken());

                session.startTransaction();
                acct.updateOne(session, Filters.eq("k", 1), Updates.inc("v", -1000));
                acct.insertOne(session, new Document("_id", "c").append("k", 199).append("v", 5));
                System.out.println("before abort " + values(acct, session));
                session.abortTransaction();
            }
            System.out.println("after " + values(acct, null));
        }
    }
}
