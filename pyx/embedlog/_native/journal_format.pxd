from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t

# journal_format.pyx's grammar: a record's head and its types
cdef enum:
    RECORD_HEADER_SIZE = 9      # len:u32 crc:u32 type:u8
    REC_ENTRY = 1
    REC_LEDGER_KEY = 2
    REC_FENCE = 3
    REC_EXPLICIT_LAC = 4
    REC_TERM = 5
    REC_TRUNCATE = 6
    REC_DELETE_LEDGER = 7
    REC_TRIM = 8
    REC_ENTRY_CRC32C = 9        # an entry whose own CRC32C digest covers its payload
    REC_INCARNATION = 10        # the ledger's incarnation (metadata ctime) as first adopted
    REC_GROUP = 11              # a group's first record: the group's length (power-loss bounds)
    REC_MAX = 11                # the highest type of the grammar
    GROUP_RECORD_SIZE = 13      # RECORD_HEADER_SIZE + group_len:u32
