package shardlog.ycsb;

import com.mongodb.ConnectionString;
import com.mongodb.client.FindIterable;
import com.mongodb.client.MongoClient;
import com.mongodb.client.MongoClients;
import com.mongodb.client.MongoCollection;
import com.mongodb.client.MongoCursor;
import com.mongodb.client.MongoDatabase;
import com.mongodb.client.model.Filters;
import com.mongodb.client.model.InsertManyOptions;
import com.mongodb.client.model.Projections;
import com.mongodb.client.model.ReplaceOneModel;
import com.mongodb.client.model.ReplaceOptions;
import com.mongodb.client.model.Sorts;
import com.mongodb.client.result.DeleteResult;
import com.mongodb.client.result.UpdateResult;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import java.util.concurrent.atomic.AtomicLong;
import org.bson.Document;
import org.bson.conversions.Bson;
import org.bson.types.Binary;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

/**
 * A YCSB binding that speaks to a MongoDB wire endpoint (a shardlog router, or a mongos / mongod)
 * through the MongoDB Java driver (mongodb-driver-sync).
 *
 * <p>Data model, as YCSB's own MongoDB binding lays it out so that figures compare: one document
 * per record in collection {@code <table>} (YCSB's {@code usertable}), {@code _id} = the record key
 * (a string), each field a BSON binary value. Operations:
 *
 * <ul>
 *   <li>read: {@code find({_id: key})} with a projection of the asked fields; no document is
 *       NOT_FOUND.
 *   <li>scan: {@code find({_id: {$gte: start}}).sort({_id: 1}).limit(n)}; an empty result is
 *       NOT_FOUND (YCSB's binding says ERROR; the core workload only scans from loaded keys).
 *   <li>update: {@code updateOne({_id: key}, {$set: fields})}; nothing matched is NOT_FOUND.
 *   <li>insert: {@code insertOne}, or with {@code batchsize} &gt; 1 unordered {@code insertMany}
 *       batches (BATCHED_OK until a batch is sent; the rest is sent on cleanup); with {@code
 *       mongodb.upsert=true} a replace-with-upsert instead.
 *   <li>delete: {@code deleteOne({_id: key})}; nothing deleted is NOT_FOUND.
 * </ul>
 *
 * <p>Properties: {@code mongodb.url} (default {@code mongodb://127.0.0.1:27017/ycsb?w=1}; the
 * connection string's options, write concern and read preference included, apply to every
 * operation), {@code mongodb.database} (default: the URL's database, else {@code ycsb}), {@code
 * batchsize} (default 1), {@code mongodb.upsert} (default false).
 *
 * <p>YCSB makes one instance per client thread; they share one {@link MongoClient} (one
 * connection pool), closed when the last instance is cleaned up.
 */
public class MongoWireClient extends DB {
  public static final String DEFAULT_URL = "mongodb://127.0.0.1:27017/ycsb?w=1";
  public static final String DEFAULT_DATABASE = "ycsb";

  private static final Object LOCK = new Object();
  private static int instances;
  private static MongoClient client;
  private static MongoDatabase database;
  private static int batchSize;
  private static boolean upsert;

  /** Errors are printed to stderr, the first few in full and then one in 1,000. */
  private static final AtomicLong ERRORS = new AtomicLong();

  private static final InsertManyOptions UNORDERED = new InsertManyOptions().ordered(false);
  private static final ReplaceOptions UPSERT = new ReplaceOptions().upsert(true);

  private final List<Document> pending = new ArrayList<>();
  private String pendingTable;

  @Override
  public void init() throws DBException {
    synchronized (LOCK) {
      instances++;
      if (client != null) {
        return;
      }
      Properties props = getProperties();
      String url = props.getProperty("mongodb.url", DEFAULT_URL);
      ConnectionString cs;
      try {
        cs = new ConnectionString(url);
      } catch (IllegalArgumentException e) {
        instances--;
        throw new DBException("mongodb.url " + url + " is not a MongoDB connection string: " + e.getMessage(), e);
      }
      String name = props.getProperty("mongodb.database");
      if (name == null || name.isEmpty()) {
        name = cs.getDatabase();
      }
      if (name == null || name.isEmpty() || name.equals("admin")) {
        name = DEFAULT_DATABASE;
      }
      try {
        batchSize = Math.max(1, Integer.parseInt(props.getProperty("batchsize", "1")));
      } catch (NumberFormatException e) {
        instances--;
        throw new DBException("batchsize must be an integer: " + e.getMessage(), e);
      }
      upsert = Boolean.parseBoolean(props.getProperty("mongodb.upsert", "false"));
      // MongoClients.create applies the connection string's write concern, read preference,
      // read concern, retryWrites and pool options to the client and what it hands out.
      client = MongoClients.create(cs);
      database = client.getDatabase(name);
      System.err.println(
          "shardlog.ycsb.MongoWireClient: " + cs.getHosts() + " database " + name + ", write concern "
              + database.getWriteConcern() + ", batchsize " + batchSize + (upsert ? ", upserts" : ""));
    }
  }

  @Override
  public void cleanup() throws DBException {
    Status flushed = flush();
    synchronized (LOCK) {
      if (--instances == 0 && client != null) {
        try {
          client.close();
        } finally {
          client = null;
          database = null;
        }
      }
    }
    if (flushed == Status.ERROR) {
      throw new DBException("the last insert batch failed");
    }
  }

  private static MongoCollection<Document> collection(String table) {
    return database.getCollection(table);
  }

  private static Status error(String op, String key, Exception e) {
    long n = ERRORS.incrementAndGet();
    if (n <= 10 || n % 1000 == 0) {
      System.err.println("shardlog.ycsb.MongoWireClient: " + op + " " + key + " failed (error " + n + "): " + e);
    }
    return Status.ERROR;
  }

  private static Bson projection(Set<String> fields) {
    return fields == null ? null : Projections.include(new ArrayList<>(fields));
  }

  /** The record's fields (binary values) into {@code into}; {@code _id} and other types skipped. */
  private static void fields(Document doc, Map<String, ByteIterator> into) {
    for (Map.Entry<String, Object> e : doc.entrySet()) {
      if (e.getValue() instanceof Binary b) {
        into.put(e.getKey(), new ByteArrayByteIterator(b.getData()));
      }
    }
  }

  private static Document record(String key, Map<String, ByteIterator> values) {
    Document doc = new Document("_id", key);
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      doc.put(e.getKey(), e.getValue().toArray());
    }
    return doc;
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      Document doc = collection(table).find(Filters.eq("_id", key)).projection(projection(fields)).first();
      if (doc == null) {
        return Status.NOT_FOUND;
      }
      fields(doc, result);
      return Status.OK;
    } catch (Exception e) {
      return error("read", key, e);
    }
  }

  @Override
  public Status scan(
      String table, String startkey, int recordcount, Set<String> fields, Vector<HashMap<String, ByteIterator>> result) {
    FindIterable<Document> find = collection(table)
        .find(Filters.gte("_id", startkey))
        .sort(Sorts.ascending("_id"))
        .limit(recordcount)
        .batchSize(Math.max(1, recordcount))
        .projection(projection(fields));
    try (MongoCursor<Document> cursor = find.iterator()) {
      result.ensureCapacity(recordcount);
      while (cursor.hasNext()) {
        HashMap<String, ByteIterator> row = new HashMap<>();
        fields(cursor.next(), row);
        result.add(row);
      }
      return result.isEmpty() ? Status.NOT_FOUND : Status.OK;
    } catch (Exception e) {
      return error("scan", startkey, e);
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      Document set = new Document();
      for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
        set.put(e.getKey(), e.getValue().toArray());
      }
      UpdateResult r = collection(table).updateOne(Filters.eq("_id", key), new Document("$set", set));
      return r.wasAcknowledged() && r.getMatchedCount() == 0 ? Status.NOT_FOUND : Status.OK;
    } catch (Exception e) {
      return error("update", key, e);
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    Document doc = record(key, values);
    if (batchSize == 1) {
      try {
        if (upsert) {
          collection(table).replaceOne(Filters.eq("_id", key), doc, UPSERT);
        } else {
          collection(table).insertOne(doc);
        }
        return Status.OK;
      } catch (Exception e) {
        return error("insert", key, e);
      }
    }
    if (pendingTable != null && !pendingTable.equals(table)) {
      Status s = flush();
      if (s == Status.ERROR) {
        return s;
      }
    }
    pendingTable = table;
    pending.add(doc);
    return pending.size() < batchSize ? Status.BATCHED_OK : flush();
  }

  /** Sends this thread's pending insert batch, if any. */
  private Status flush() {
    if (pending.isEmpty()) {
      return Status.OK;
    }
    List<Document> batch = new ArrayList<>(pending);
    pending.clear();
    try {
      MongoCollection<Document> c = collection(pendingTable);
      if (upsert) {
        List<ReplaceOneModel<Document>> models = new ArrayList<>(batch.size());
        for (Document d : batch) {
          models.add(new ReplaceOneModel<>(Filters.eq("_id", d.get("_id")), d, UPSERT));
        }
        c.bulkWrite(models);
      } else {
        c.insertMany(batch, UNORDERED);
      }
      return Status.OK;
    } catch (Exception e) {
      return error("insert batch of " + batch.size() + " from", String.valueOf(batch.get(0).get("_id")), e);
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      DeleteResult r = collection(table).deleteOne(Filters.eq("_id", key));
      return r.wasAcknowledged() && r.getDeletedCount() == 0 ? Status.NOT_FOUND : Status.OK;
    } catch (Exception e) {
      return error("delete", key, e);
    }
  }
}
